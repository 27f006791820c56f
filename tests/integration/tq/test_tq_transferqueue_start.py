"""``deployment: transferqueue`` with no public TransferQueue running: the deployment starts one and
closes it at shutdown (one it joined is left running: see test_tq_transferqueue.py)."""

import numpy as np
import pytest

from dressage.tq import TransferQueue

ray = pytest.importorskip("ray")
pytest.importorskip("transfer_queue")

pytestmark = pytest.mark.ray


def _controller_running():
    try:
        ray.get_actor("TransferQueueController", namespace="transfer_queue")
    except ValueError:
        return False
    return True


def test_a_deployment_starts_the_public_queue_it_needs_and_closes_it():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert not _controller_running()
        with TransferQueue.start({"deployment": "transferqueue", "num_storage_units": 1}) as tq:
            assert _controller_running()
            client = tq.client()
            ref = client.put("logprobs", np.arange(4, dtype=np.float32), batch="b")
            np.testing.assert_array_equal(client.get(ref), np.arange(4))
            assert client.clear("b") == 1 and tq.total_keys() == 0
        assert not _controller_running()
    finally:
        ray.shutdown()
