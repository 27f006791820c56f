"""The OpenAI-compatible endpoints, one room each (chat, Responses, text completions): a request's schema
beside the object that serves it, over the shared recording and engine collaborators."""
