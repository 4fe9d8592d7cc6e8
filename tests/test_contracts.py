"""Each of the package's parts provides the contract it declares (``scrapyd_pgqueue/contracts.py``), with every
member's signature: the launcher, node/ and the services rely on them instead of probing."""

import pytest
from zope.interface.verify import verifyClass

from scrapyd_pgqueue.components.eggstorage import PostgresEggStorage
from scrapyd_pgqueue.components.jobstorage import PostgresJobStorage
from scrapyd_pgqueue.components.poller import PostgresPoller
from scrapyd_pgqueue.contracts import IClaimingPoller, IEggFiles, INodeCrawls, INodeRoot, IRecordingJobStorage
from scrapyd_pgqueue.node.crawls import NodeCrawls
from scrapyd_pgqueue.web.root import Root


@pytest.mark.parametrize("contract, component", [
    (IClaimingPoller, PostgresPoller),
    (IRecordingJobStorage, PostgresJobStorage),
    (IEggFiles, PostgresEggStorage),
    (INodeCrawls, NodeCrawls),
    (INodeRoot, Root),
])
def test_each_component_provides_its_contract(contract, component):
    assert verifyClass(contract, component)

