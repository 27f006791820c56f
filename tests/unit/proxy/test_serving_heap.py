"""``tune_gc_for_serving``: start-up garbage is collected, what is left is frozen, young collections thin out,
and the young generation's survivors are swept into the frozen one (a full collection now and then)."""

import gc
import threading
import time
import weakref

import pytest

from dressage.errors import ConfigError
from dressage.serving import SERVING_GC_YOUNG, ServingGc, YoungSweeper, tune_gc_for_serving


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
        sweeper = tune_gc_for_serving(ServingGc(sweep_every_s=0))  # no sweeping thread: this test's objects stay
        assert sweeper.policy.sweep_every_s == 0 and sweeper._thread is None
        frozen = gc.get_freeze_count()
        assert dead() is None  # the cycle made before went, it was not frozen
        assert frozen > before
        assert not any(o is kept for o in gc.get_objects())  # out of every generation's walk
        made_after = _Node()
        assert any(o is made_after for o in gc.get_objects())
        assert gc.get_threshold() == (SERVING_GC_YOUNG, threshold[1], threshold[2])
        later = _Node()
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None  # with no sweep between, cycles made while serving are still collected
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


def test_a_sweep_collects_the_young_cycles_freezes_the_survivors_and_a_full_one_frees_frozen_cycles():
    sweeper = YoungSweeper(ServingGc(sweep_every_s=0, full_every_s=3600))
    sweeper._rebase()
    try:
        kept, dropped = _Node(), _Node()
        dead = weakref.ref(dropped)
        del dropped
        assert sweeper.sweep() is False
        assert dead() is None  # cyclic garbage of the young generation: collected by the sweep
        assert not any(o is kept for o in gc.get_objects())  # the survivor is frozen: no collection walks it
        later = _Node()
        gone = weakref.ref(later)
        assert sweeper.sweep() is False
        del later
        gc.collect()
        assert gone() is not None  # a cycle that outlived a sweep waits in the frozen generation ...
        sweeper.full_at = time.monotonic() - 1.0
        assert sweeper.sweep() is True
        assert gone() is None  # ... until the full collection, which freezes the survivors again
        assert not any(o is kept for o in gc.get_objects())
        assert sweeper.full_at > time.monotonic() + 3000
    finally:
        gc.unfreeze()


def test_the_sweeping_thread_freezes_new_survivors_and_stops():
    sweeper = YoungSweeper(ServingGc(sweep_every_s=0.01))
    made = _Node()
    try:
        sweeper.start()
        assert any(t.name == "dressage-gc-sweep" for t in threading.enumerate())
        deadline = time.monotonic() + 30
        while any(o is made for o in gc.get_objects()):
            assert time.monotonic() < deadline, "no sweep froze the object"
            time.sleep(0.01)
        sweeper.stop()
        assert sweeper._thread is None and not any(t.name == "dressage-gc-sweep" for t in threading.enumerate())
    finally:
        sweeper.stop()
        gc.unfreeze()


def test_a_drained_process_collects_its_frozen_cycles_once_per_idle_spell_after_work():
    busy = [False]
    sweeper = YoungSweeper(ServingGc(sweep_every_s=0, full_every_s=3600, idle_full_every_s=0.05),
                           idle=lambda: not busy[0])
    sweeper._rebase()
    try:
        late = _Node()
        gone = weakref.ref(late)
        assert sweeper.sweep() is False  # idle, but no work since the last full collection
        del late
        time.sleep(0.06)
        assert sweeper.sweep() is False and gone() is not None  # idle still: the frozen cycle waits
        busy[0] = True
        assert sweeper.sweep() is False  # work: calls in flight are never walked by a full collection
        busy[0] = False
        assert sweeper.sweep() is True and gone() is None  # drained after work: everything collected
        assert sweeper.sweep() is False  # once per idle spell
        busy[0] = True
        assert sweeper.sweep() is False
        busy[0] = False
        sweeper._last_full = time.monotonic()  # the last full collection was just now: not again so soon
        assert sweeper.sweep() is False
        sweeper._last_full -= 0.06
        assert sweeper.sweep() is True
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("bad", [{"young": 0}, {"sweep_every_s": -1.0}, {"full_every_s": 0.0},
                                 {"idle_full_every_s": -1.0}])
def test_a_bad_serving_gc_policy_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="serving gc"):
        ServingGc(**bad)
