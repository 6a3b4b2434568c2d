"""Pytest plugin: SkyPilot's enabled clouds, seeded offline, for tests that run its optimizer.

`sky check` needs the network and credentials; it only records which clouds are usable in
SkyPilot's state database (`$SKY_RUNTIME_DIR/.sky/state.db`). `sky_enabled_clouds` writes that
record directly, once per session, inside the test runtime folder conftest.py set up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

#: The clouds the shared catalog snapshot covers, spelled as SkyPilot's registry repr.
SEEDED_CLOUDS = ["AWS", "GCP", "Lambda", "RunPod"]


@pytest.fixture(scope="session")
def sky_enabled_clouds() -> Iterator[list[str]]:
    """Mark SEEDED_CLOUDS enabled (compute and storage) in SkyPilot's state; yield them.

    Offline and without AWS credentials, SkyPilot's dry run asks boto3 for a client (to read
    the image's size) and retries the missing credentials 5 times with backoff: ~50 s of
    sleep, then the same NoCredentialsError it handles. One attempt here: the same answer."""
    if not os.environ.get("SKY_RUNTIME_DIR"):
        pytest.skip("SKY_RUNTIME_DIR is unset: refusing to seed the user's own SkyPilot state")
    from sky import check as sky_check
    from sky import global_user_state, skypilot_config
    from sky.clouds import cloud as cloud_lib

    workspace = skypilot_config.get_active_workspace()
    global_user_state.set_allowed_clouds(
        sky_check._get_workspace_allowed_clouds(workspace), workspace
    )
    for capability in (cloud_lib.CloudCapability.COMPUTE, cloud_lib.CloudCapability.STORAGE):
        global_user_state.set_enabled_clouds(list(SEEDED_CLOUDS), capability, workspace)
    from sky.adaptors import aws

    attempts = aws._MAX_ATTEMPT_FOR_CREATION
    aws._MAX_ATTEMPT_FOR_CREATION = 1
    try:
        yield list(SEEDED_CLOUDS)
    finally:
        aws._MAX_ATTEMPT_FOR_CREATION = attempts
