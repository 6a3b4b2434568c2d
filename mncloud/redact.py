"""Secret redaction: nothing that looks like a credential reaches a run record.

Every string is scrubbed (`Redactor`) before a record is written: the values of the spec's
`--secret` names and of any variable (in `--env` or in the launching environment) whose name
looks sensitive (`*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*_KEY`, …), and anything shaped like a
credential (AWS key ids, private-key blocks, GitHub/Hugging Face/Slack tokens, JWTs,
`user:password@` in URLs). `--env` values are rendered into the task YAML by design (use
`--secret` for secrets); the copy of that YAML in the record is scrubbed all the same.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

REDACTED = "<redacted>"

_SENSITIVE_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|(^|_)KEY$|(^|_)AUTH", re.I
)
_MIN_SECRET_LEN = 6
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S
        ),
        REDACTED,
    ),
    (re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    # user:password@ in URLs
    (re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"), REDACTED),
    # NAME=value / NAME: value / "name": "value" where NAME looks sensitive
    (
        re.compile(
            r"""(?ix)
            (["']?[A-Z0-9_.-]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY)
             [A-Z0-9_.-]*["']?\s*[:=]\s*["']?)
            (?!<redacted>)[^\s"',}]{6,}"""
        ),
        r"\1" + REDACTED,
    ),
]


def looks_like_credential(name: str, value: str) -> bool:
    """Whether `NAME=value` would be scrubbed from a record: a sensitive name with a value,
    or a credential-shaped value (the same rules `Redactor` applies)."""
    if value and _SENSITIVE_NAME.search(name):
        return True
    text = f"{name}={value}"
    return Redactor().scrub(text) != text


class Redactor:
    """Scrubs known secret values and credential-shaped text out of strings."""

    def __init__(self, values: set[str] | None = None) -> None:
        # Longest first, so a value containing another is replaced whole.
        self.values = sorted(
            {v for v in (values or set()) if len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True
        )

    def scrub(self, text: str) -> str:
        """`text` with every secret replaced by `<redacted>`."""
        for value in self.values:
            if value in text:
                text = text.replace(value, REDACTED)
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
        return text

    def scrub_obj(self, obj: Any) -> Any:
        """A copy of JSON-like data with every string (keys too) scrubbed."""
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, Mapping):
            return {self.scrub_obj(k): self.scrub_obj(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.scrub_obj(v) for v in obj]
        return obj


def is_sensitive_name(name: str) -> bool:
    """Whether an environment variable's name suggests its value is a secret."""
    return bool(_SENSITIVE_NAME.search(name))


def redactor_for(
    secret_names: list[str] | None = None,
    envs: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Redactor:
    """A Redactor for the values of `secret_names` and of sensitive-looking variables.

    `envs` are the spec's `--env` values; `environ` the launching environment (os.environ).
    """
    environ = os.environ if environ is None else environ
    values: set[str] = set()
    for name in secret_names or []:
        if environ.get(name):
            values.add(environ[name])
    for source in (envs or {}, environ):
        for name, value in source.items():
            if value and is_sensitive_name(name):
                values.add(value)
    return Redactor(values)


def spec_redactor(spec: BaseModel | Mapping[str, Any] | None) -> Redactor:
    """The Redactor for a spec (a JobSpec or its JSON), reading secret values from os.environ."""
    if spec is None:
        return redactor_for()
    data = spec if isinstance(spec, Mapping) else spec.model_dump(mode="json")
    return redactor_for(list(data.get("secrets") or []), dict(data.get("envs") or {}))
