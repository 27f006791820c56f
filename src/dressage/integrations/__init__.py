"""Adapters to training frameworks: restored Samples in the shapes their trainers read."""
