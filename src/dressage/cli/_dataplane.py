"""The seed's data-plane flags, shared by ``dressage run`` and ``dressage proxy serve``.

Generated from :class:`dressage.dataplane.DataPlaneConfig`'s fields (:mod:`dressage.flags`).
"""

from __future__ import annotations

import argparse

from dressage.dataplane import DataPlaneConfig
from dressage.flags import add_flags, from_flags

__all__ = ["add_data_plane_args", "data_plane_config", "transfer_queue_config"]


def add_data_plane_args(p: argparse.ArgumentParser) -> None:
    add_flags(p.add_argument_group("data plane (the seed's flags)"), DataPlaneConfig)


def data_plane_config(args: argparse.Namespace) -> DataPlaneConfig:
    return from_flags(DataPlaneConfig, args)


def transfer_queue_config(args: argparse.Namespace):
    """The TQ config the flags select (``None`` when TQ is off)."""
    if not args.enable_transfer_queue:
        return None
    from dressage.tq import load_config

    return load_config(args.transfer_queue_config)
