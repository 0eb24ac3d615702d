"""Secrets: which names hold them, and keeping their values out of run files and output.

One rule decides what a secret is (``is_secret_name``); everything else here applies it:

- a variable whose name is secret-shaped (``HF_TOKEN``, ``GITHUB_PAT``, ``AWS_ACCESS_KEY_ID``,
  ``DB_PASSWORD``, ``CLIENT_SECRET``, ``WANDB_API_KEY``) never gets a literal value in a
  recipe or profile: the job receives it through the profile's ``pass_env``, copied from the
  submitting shell at submit time;
- a name that ends in a place (``HF_TOKEN_PATH``, ``SSH_KEY_FILE``) names where a secret
  lies, not the secret, and is an ordinary name;
- no recipe or profile value may come from a secret-shaped variable (``${oc.env:HF_TOKEN}``,
  however written, or a key interpolating such a key): the loader records what every
  ``${oc.env:...}`` reads (``hpcrl.config.merged_yaml``) and the value never reaches a file;
- as a last guard, text about to be written to a run file or shown to the user is searched
  for the values of this shell's secret-shaped variables and for well-known token shapes
  (``find_secrets``; ``redact`` hides them in messages).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

#: Words (split at anything but letters and digits) that make a name a secret's.
SECRET_WORDS = frozenset(
    {
        "TOKEN",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWD",
        "PASS",
        "PASSPHRASE",
        "PAT",
        "KEY",
        "APIKEY",
    }
)
#: Parts that make any word containing them secret (``MYSECRET``, ``DBPASSWORD``).
SECRET_PARTS = ("SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "PRIVATEKEY")
#: A last word that names where a secret lies, not the secret itself.
PLACE_WORDS = frozenset({"PATH", "FILE", "DIR", "HOME"})
#: Values shorter than this are not searched for in text (``1`` or ``true`` are everywhere).
MIN_SECRET_LENGTH = 8
#: Well-known token formats, found even when no variable holds them.
TOKEN_SHAPES = (
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,})")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("an API key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_-]{30,}")),
    ("a Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{20,}")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    (
        "a password in a URL",
        re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*:/{1,3})([^/\s:@'\"]+):[^/\s@'\"]+@"),
    ),
)
#: How a found shape is hidden when the text around it is worth keeping: the URL, its user.
KEPT_AROUND = {"a password in a URL": r"\1\2:<password hidden>@"}
PASS_ENV_FIX = (
    "remove the value; list {name} under the cluster profile's pass_env instead (the job then "
    "gets it from the shell you submit from, and it is never written to disk)"
)
_ASSIGNMENT = re.compile(r"^-*([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_SEPARATORS = re.compile(r"[\s,;&|()]+")


def is_secret_name(name: str) -> bool:
    """True when an environment variable called ``name`` would hold a secret."""
    words = [word for word in re.split(r"[^A-Z0-9]+", str(name).upper()) if word]
    if not words or words[-1] in PLACE_WORDS:
        return False
    return any(word in SECRET_WORDS or any(part in word for part in SECRET_PARTS) for word in words)


def literal_secret_assignments(text: str) -> list[str]:
    """Secret-shaped names given a literal value in shell-like text or a scheduler option:
    ``export HF_TOKEN=hf_x``, ``--export=ALL,GITHUB_PAT=ghp_x``, ``--export=DB_PASSWORD=x``,
    ``--export GITHUB_PAT=x,ALL``, any ``--opt=NAME=value``. ``HF_TOKEN=$HF_TOKEN`` reads the
    variable at run time and ``--export=HF_TOKEN`` passes it on: both are fine."""
    names = []
    for token in _SEPARATORS.split(text):
        for name, value in _assignments(token):
            if is_secret_name(name) and value and not value.startswith("$"):
                names.append(name)
    return names


def _assignments(token: str) -> Iterator[tuple[str, str]]:
    """``(name, value)`` of a ``NAME=value`` token and of every assignment its value holds in
    turn (``--export=DB_PASSWORD=x``: ``export`` = ``DB_PASSWORD=x``, ``DB_PASSWORD`` = ``x``)."""
    match = _ASSIGNMENT.match(token.strip("'\""))
    while match is not None:
        name, value = match.group(1), match.group(2).strip("'\"")
        yield name, value
        match = _ASSIGNMENT.match(value)


def secret_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """value -> name of this shell's secret-shaped variables worth searching for (long enough
    to be specific; a path is where a secret lies, not one)."""
    environ = os.environ if environ is None else environ
    return {
        value: name
        for name, value in environ.items()
        if is_secret_name(name)
        and len(value) >= MIN_SECRET_LENGTH
        and not value.startswith(("/", "~", "."))
    }


def find_secrets(text: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """What in ``text`` is a secret: ``$NAME`` for a variable's value, else the token kind."""
    found = [f"${name}" for value, name in secret_values(environ).items() if value in text]
    found += [kind for kind, shape in TOKEN_SHAPES if shape.search(text)]
    return found


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret value and token replaced by a marker naming what it was."""
    for value, name in sorted(secret_values(environ).items(), key=lambda item: -len(item[0])):
        text = text.replace(value, f"<value of ${name} hidden>")
    for kind, shape in TOKEN_SHAPES:
        text = shape.sub(KEPT_AROUND.get(kind, f"<{kind} hidden>"), text)
    return text
