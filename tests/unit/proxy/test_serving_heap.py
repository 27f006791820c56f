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
