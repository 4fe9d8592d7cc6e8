"""Each of the package's parts provides the contract it declares (``scrapyd_pgqueue/contracts.py``), with every
member's signature: the launcher, node/ and the services rely on them instead of probing."""

import pytest
from zope.interface.verify import verifyClass

from scrapyd_pgqueue.components.eggstorage import PostgresEggStorage
from scrapyd_pgqueue.components.jobstorage import PostgresJobStorage
from scrapyd_pgqueue.components.poller import PostgresPoller
from scrapyd_pgqueue.contracts import IClaimingPoller, IEggFiles, IRecordingJobStorage


@pytest.mark.parametrize("contract, component", [
    (IClaimingPoller, PostgresPoller),
    (IRecordingJobStorage, PostgresJobStorage),
    (IEggFiles, PostgresEggStorage),
])
def test_each_component_provides_its_contract(contract, component):
    assert verifyClass(contract, component)
