"""What ``dressage run`` needs to run without a GPU or a real agent: simulated agents, the run loop and
the trainer's routing-replay check against the engine's tiny MoE model.

The product (proxy, tq, trajectory, rollout, train, integrations) never imports this package; a real
deployment points the Proxy at SGLang and brings its own agents.
"""
