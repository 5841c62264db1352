"""``freeze_loaded_objects``: garbage collected first, the rest left out of the collector's full collections."""

import gc
import weakref

from dynvocab.loading import freeze_loaded_objects


class Node:
    pass


def test_garbage_is_collected_first_and_what_is_alive_leaves_the_collector():
    garbage = Node()
    garbage.itself = garbage  # a reference cycle: only the cyclic collector frees it
    collected = weakref.ref(garbage)
    del garbage
    loaded = Node()
    loaded.itself = loaded
    freeze_loaded_objects()
    assert collected() is None and gc.get_freeze_count() > 0
    assert not any(o is loaded for o in gc.get_objects())  # frozen: full collections no longer walk it
    gc.unfreeze()
    assert any(o is loaded for o in gc.get_objects())
