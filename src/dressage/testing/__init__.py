"""``dressage.testing``: conformance suites, fault injection and a wire fuzzer for TransferQueue backends.

Third-party StorageUnits, Controllers and clients prove they behave like ours by subclassing the same
pytest suites our own tests subclass (needs ``pytest``: ``pip install 'dressage[testing]'``):

=================================  ====================================================================
``StorageUnitTests``               a StorageUnit backend; define ``make_unit(memory_budget)``
``ClientTests``                    a client against a running TransferQueue; define ``connect(tq)``
                                   (``tq_config()`` may change the deployment)
``ControllerTests``                a key directory; define ``make_controller(units, *, strict_budget)``
``serve_unit(backend)``            a backend behind a ZMQ StorageUnitServer, as a RemoteStorageUnit
``serve_controller(controller)``   a Controller behind a ZMQ ControllerServer, as a RemoteController
=================================  ====================================================================

Fault injection (:mod:`dressage.testing.faults`), through public handles only:
``kill_unit(tq, unit_id, sig=SIGKILL)`` signals a unit's process by the pid ``tq.processes()`` reports;
``stopped_unit(tq, unit_id)`` is a context manager that SIGSTOPs it and resumes it on exit;
``corrupt_blob(unit, key, byte)`` flips one stored byte of an in-process unit (``tq.storage_units()``);
``wait_unit_state(tq, unit_id, "dead", timeout_s)`` waits for the Controller's verdict.

The wire fuzzer (:mod:`dressage.testing.wirefuzz`): ``fuzz_server(address, n, ...)`` throws ``n`` hostile
multipart messages (``hostile_message``, of every kind in ``KINDS``) at any StorageUnit or Controller
socket and reports in a ``FuzzReport`` whether each got a typed error reply and whether valid requests
still work. See docs/testing.md.

The engine + Proxy test stack (:mod:`dressage.testing.stack`, needs the ``server`` extra): ``start_engine``
and ``start_proxy`` start the built-in engine and a Proxy over loopback, ``ProxyStack`` holds what ran.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StorageUnitTests", "ClientTests", "ControllerTests", "serve_unit", "serve_controller",
           "kill_unit", "stopped_unit", "corrupt_blob", "wait_unit_state", "unit_pid",
           "fuzz_server", "hostile_message", "FuzzReport", "KINDS", "start_engine", "start_proxy", "ProxyStack"]

_WHERE = {
    "StorageUnitTests": "storage", "serve_unit": "storage",
    "ClientTests": "client",
    "ControllerTests": "controller", "serve_controller": "controller",
    "kill_unit": "faults", "stopped_unit": "faults", "corrupt_blob": "faults", "wait_unit_state": "faults",
    "unit_pid": "faults",
    "fuzz_server": "wirefuzz", "hostile_message": "wirefuzz", "FuzzReport": "wirefuzz", "KINDS": "wirefuzz",
    "start_engine": "stack", "start_proxy": "stack", "ProxyStack": "stack",
}


def __getattr__(name: str) -> Any:
    # Lazy: fault injection and the fuzzer work without pytest; only the suites import it.
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'dressage.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"dressage.testing.{module}"), name)
