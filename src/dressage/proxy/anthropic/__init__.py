"""``POST /v1/messages``: the Anthropic Messages API taken down the chat call path, and its server-sent events."""
