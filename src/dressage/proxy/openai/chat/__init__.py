"""``POST /v1/chat/completions``: the prompt with TITO reuse, parameters, samples, replies, and the serving
object that takes a call from its request to its StepRecord commit."""
