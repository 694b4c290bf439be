"""Where each location's messages live (LocationQueues): the queue's name says
its location, and every key a dispatch call declares is in that location's slot."""

from __future__ import annotations

from redis.crc import key_slot

from importer.adapters.redis.keys import Keys, LocationQueues
from importer.domain.locations import MAIN


def test_on_a_cluster_each_location_has_its_own_queue_in_its_own_slot() -> None:
    queues = LocationQueues("{importer}:", "imports", per_location=True)
    assert queues.queue_of(MAIN) == "imports"
    assert queues.queue_of("paris") == "imports@paris"
    for queue, location in [
        ("imports", MAIN), ("imports.DQ", MAIN), ("imports@paris", "paris"), ("imports@paris.DQ", "paris"),
        ("imports@paris.XQ", "paris"), ("other@paris", MAIN),
    ]:
        assert queues.location_of(queue) == location, queue
    stock_slot = key_slot(Keys("{importer}:", "paris").stock.encode())
    for queue in ("imports@paris", "imports@paris.DQ"):
        keys = queues.dispatch_keys(queue)
        assert keys[0] == "{importer@paris}:dramatiq" and len(set(keys)) == 2
        assert {key_slot(k.encode()) for k in keys} == {stock_slot}
    assert queues.upload_prefix_of("imports@paris") == Keys("{importer}:", "paris").upload("")
    assert queues.is_import_queue("imports@paris") and queues.is_import_queue("imports")
    assert not queues.is_import_queue("imports@paris.DQ") and not queues.is_import_queue("imports.DQ")


def test_on_one_node_every_location_shares_mains_queue() -> None:
    queues = LocationQueues("{importer}:", "imports", per_location=False)
    assert queues.queue_of("paris") == queues.queue_of(MAIN) == "imports"
    assert queues.dispatch_keys("imports") == ["{importer}:dramatiq", "{importer}:dramatiq:imports"]
