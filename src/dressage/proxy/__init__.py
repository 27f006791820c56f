"""Proxy layer: the online side between agents and the inference engine."""
