"""The engines behind the Proxy: the SGLang (and sglang-router) client, its transport, the pool of engines
with sticky sessions and failover, engine weight versions, and one model call as engine requests."""
