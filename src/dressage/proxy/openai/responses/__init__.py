"""``POST /v1/responses``: the Responses API taken down the chat call path, and its server-sent events."""
