"""The AWS set-up page's IAM policy grants every S3 call mncloud makes (issue #60).

The suite's S3 tests (`tests/test_storage.py`, `tests/test_buckets.py`: the `Bucket` interface,
multipart uploads, ranged reads, listings, bucket checks and creation, against a real S3 server)
run in a child pytest with `-p tests.s3calls`, which records the operation of every request
mncloud's own boto3 clients send (botocore's `before-call` event). Each operation needs an IAM
action on the bucket or on its objects (`ACTIONS`, from AWS's list of S3 actions); the policy
in docs/clouds/aws.md (the fence titled `mncloud-bucket-policy.json`) must allow each on a
resource of that kind. An operation `ACTIONS` does not know fails too: add its action here and
to the page. The S3 calls in mncloud's source are held to `ACTIONS` as well, so a call the
tests never make (an abort after a failed upload) is not missed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docblocks import ROOT

PAGE = ROOT / "docs" / "clouds" / "aws.md"
POLICY = re.compile(r'^```json title="mncloud-bucket-policy\.json"\n(.*?)^```$', re.M | re.S)
#: The suite's S3 tests whose calls are recorded.
S3_TESTS = ("tests/test_storage.py", "tests/test_buckets.py")
#: S3 operation → (IAM action, the resource it is checked on: the bucket or its objects).
ACTIONS = {
    "AbortMultipartUpload": ("s3:AbortMultipartUpload", "object"),
    "CompleteMultipartUpload": ("s3:PutObject", "object"),
    "CreateBucket": ("s3:CreateBucket", "bucket"),
    "CreateMultipartUpload": ("s3:PutObject", "object"),
    "DeleteObject": ("s3:DeleteObject", "object"),
    "GetBucketLocation": ("s3:GetBucketLocation", "bucket"),
    "GetObject": ("s3:GetObject", "object"),
    "HeadBucket": ("s3:ListBucket", "bucket"),
    "HeadObject": ("s3:GetObject", "object"),
    "ListObjectsV2": ("s3:ListBucket", "bucket"),
    "PutObject": ("s3:PutObject", "object"),
    "UploadPart": ("s3:PutObject", "object"),
}
#: The S3 clients' calls in mncloud's source, by boto3 method (`download_file`: the transfer
#: manager's HEAD and ranged GETs), as operations.
METHODS = {"download_file": ("HeadObject", "GetObject"), "get_paginator": ("ListObjectsV2",)}


def granted(policy: dict[str, object]) -> set[tuple[str, str]]:
    """(action, bucket|object) pairs the policy's Allow statements grant."""
    out: set[tuple[str, str]] = set()
    for statement in policy["Statement"]:  # type: ignore[attr-defined]
        if statement["Effect"] != "Allow":
            continue
        actions = statement["Action"]
        resources = statement["Resource"]
        for action in [actions] if isinstance(actions, str) else actions:
            for resource in [resources] if isinstance(resources, str) else resources:
                kind = "object" if "/" in resource.removeprefix("arn:aws:s3:::") else "bucket"
                out.add((action, kind))
    return out


def page_policy() -> dict[str, object]:
    found = POLICY.search(PAGE.read_text())
    assert found, f'{PAGE.relative_to(ROOT)}: no ```json title="mncloud-bucket-policy.json" fence'
    return dict(json.loads(found.group(1)))


def missing(operations: set[str], policy: dict[str, object]) -> list[str]:
    """What the policy lacks for these operations, one line each."""
    allowed = granted(policy)
    out = []
    for op in sorted(operations):
        if op not in ACTIONS:
            out.append(f"{op}: no IAM action known (add it to ACTIONS and to the page's policy)")
        elif ACTIONS[op] not in allowed:
            action, kind = ACTIONS[op]
            out.append(f"{op} needs {action} on the {kind}")
    return out


def source_operations() -> set[str]:
    """The operations of the boto3 client calls in mncloud/storage (snake_case → S3's name)."""
    ops: set[str] = set()
    for path in (ROOT / "mncloud" / "storage").glob("*.py"):
        for method in re.findall(r"\bclient\(\)\.(\w+)\(|\bclient\.(\w+)\(", path.read_text()):
            name = next(m for m in method if m)
            if path.name == "gcs.py" or name in ("bucket", "list_blobs", "lookup_bucket"):
                continue  # google-cloud-storage's client
            if name == "create_bucket" and path.name == "prepare.py":
                ops.add("CreateBucket")
                continue
            ops.update(METHODS.get(name, ("".join(w.title() for w in name.split("_")),)))
    return ops


def test_the_policy_on_the_page_is_valid_json_for_one_bucket() -> None:
    policy = page_policy()
    assert policy["Version"] == "2012-10-17"
    resources = {str(s["Resource"]) for s in policy["Statement"]}  # type: ignore[attr-defined]
    bucket = "arn:aws:s3:::my-team-mncloud-ckpt"
    assert resources == {bucket, f"{bucket}/*"}  # the bucket the pages use, and its objects


def test_the_policy_grants_every_s3_call_in_mncloud_source() -> None:
    ops = source_operations()
    assert {"CreateMultipartUpload", "AbortMultipartUpload", "HeadBucket"} <= ops, ops
    assert not missing(ops, page_policy())


def test_a_policy_without_a_permission_is_caught() -> None:
    """The check itself: a policy lacking one action, or granting it on the wrong resource."""
    policy = page_policy()
    ops = {"PutObject", "HeadBucket", "UploadPart"}
    assert not missing(ops, policy)
    cut = json.loads(json.dumps(policy))
    for statement in cut["Statement"]:
        statement["Action"] = [a for a in statement["Action"] if a != "s3:PutObject"]
    assert missing(ops, cut) == ["PutObject needs s3:PutObject on the object",
                                 "UploadPart needs s3:PutObject on the object"]  # fmt: skip
    wrong = json.loads(json.dumps(policy))
    wrong["Statement"][0]["Action"], wrong["Statement"][1]["Action"] = (
        wrong["Statement"][1]["Action"],
        wrong["Statement"][0]["Action"],
    )
    assert "HeadBucket needs s3:ListBucket on the bucket" in missing(ops, wrong)
    assert missing({"SelectObjectContent"}, policy)[0].startswith("SelectObjectContent: no IAM")


@pytest.mark.slow
def test_the_policy_grants_every_s3_call_the_suites_s3_tests_make(tmp_path: Path) -> None:
    """The suite's S3 tests against a real S3 server, their calls recorded: each allowed."""
    record = tmp_path / "s3calls.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *S3_TESTS, "-p", "tests.s3calls", "-n", "0", "-q",
         "-p", "no:cacheprovider", "-k", "not gs and not gcs"],
        cwd=ROOT, env={**os.environ, "MNCLOUD_S3_CALLS": str(record)},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    ops = set(record.read_text().split())
    assert {"CreateBucket", "HeadBucket", "PutObject", "GetObject", "ListObjectsV2"} <= ops, ops
    assert {"CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"} <= ops, ops
    problems = missing(ops, page_policy())
    assert not problems, f"{PAGE.relative_to(ROOT)}'s policy misses:\n" + "\n".join(problems)
