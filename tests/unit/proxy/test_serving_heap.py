"""``tune_gc_for_serving``: start-up garbage is collected, what is left is frozen, young collections thin out."""

import gc
import weakref

from dressage.serving import SERVING_GC_YOUNG, tune_gc_for_serving


class _Node:
    def __init__(self) -> None:
        self.other = self  # a reference cycle: only the cyclic collector frees it


def test_garbage_is_collected_first_and_the_rest_frozen():
    kept = _Node()
    dropped = _Node()
    dead = weakref.ref(dropped)
    del dropped
    before, threshold = gc.get_freeze_count(), gc.get_threshold()
    try:
        frozen = tune_gc_for_serving()
        assert dead() is None  # the cycle made before went, it was not frozen
        # (other threads of the suite may free frozen objects meanwhile: the count only shrinks then)
        assert frozen > before and before < gc.get_freeze_count() <= frozen
        assert not any(o is kept for o in gc.get_objects())  # out of every generation's walk
        made_after = _Node()
        assert any(o is made_after for o in gc.get_objects())
        assert gc.get_threshold() == (SERVING_GC_YOUNG, threshold[1], threshold[2])
        later = _Node()
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None  # cycles made while serving are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert any(o is kept for o in gc.get_objects())


def test_gc_pauses_count_every_collection_once_installed_and_stats_report_them():
    from dressage.proxy.config import ProxyConfig
    from dressage.proxy.deployment import build_service
    from dressage.serving import GcPauses

    clock = GcPauses()
    gc.collect()
    assert clock.snapshot() == {"collections": 0, "full_collections": 0, "pause_s": 0.0, "max_pause_ms": 0.0}
    clock.install()
    clock.install()  # once per process: a second install adds no second callback
    try:
        assert gc.callbacks.count(clock._callback) == 1
        gc.collect()
        gc.collect(0)
        got = clock.snapshot()
        # other threads of the suite may trigger collections too: at least these two were counted
        assert got["collections"] >= 2 and got["full_collections"] >= 1
        assert got["pause_s"] > 0 and 0 < got["max_pause_ms"] <= got["pause_s"] * 1e3
    finally:
        gc.callbacks.remove(clock._callback)
    service, _ = build_service(ProxyConfig())
    assert set(service.stats()["gc"]) == {"collections", "full_collections", "pause_s", "max_pause_ms"}
