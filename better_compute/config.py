"""Where the CLI's URL, token and tenant come from: flags, then the environment, then a config file.

* flags: `--url`, `--token`, `--tenant`;
* environment: `BETTER_COMPUTE_URL`, `BETTER_COMPUTE_TOKEN`, `BETTER_COMPUTE_TENANT`
  (an empty variable counts as unset);
* file: `~/.config/better-compute/config.toml` (under `$XDG_CONFIG_HOME` when set),
  or the path in `BETTER_COMPUTE_CONFIG`, with the keys `url`, `token`, `tenant`.

A flag beats the environment, which beats the file. A missing default file is
fine; a `BETTER_COMPUTE_CONFIG` that names no file, a file that is not TOML,
or an unknown key is a ConfigError (the CLI exits 2), so a typo never silently
sends a request somewhere else.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"
KEYS = ("url", "token", "tenant")
ENV = {"url": "BETTER_COMPUTE_URL", "token": "BETTER_COMPUTE_TOKEN", "tenant": "BETTER_COMPUTE_TENANT"}
ENV_CONFIG = "BETTER_COMPUTE_CONFIG"


class ConfigError(Exception):
    """The configuration cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Settings:
    """The resolved configuration; `sources` says where each value came from (flag, env, file, default)."""

    url: str
    token: str | None
    tenant: str | None
    sources: Mapping[str, str]
    config_path: Path

    def require_token(self) -> str:
        return self._required("token", "API token", " (an operator issues one with `manage.py issue_token`)")

    def require_tenant(self) -> str:
        return self._required("tenant", "tenant")

    def _required(self, key: str, what: str, hint: str = "") -> str:
        """The value of `key`, or a ConfigError naming the three places that can give it."""
        value = getattr(self, key)
        if not value:
            raise ConfigError(
                f'no {what}: pass --{key}, set {ENV[key]}, or put {key} = "..." in {self.config_path}{hint}'
            )
        return str(value)


def config_path(environ: Mapping[str, str]) -> tuple[Path, bool]:
    """The config file's path and whether it was named explicitly (`BETTER_COMPUTE_CONFIG`)."""
    explicit = environ.get(ENV_CONFIG)
    if explicit:
        return Path(explicit).expanduser(), True
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "better-compute" / "config.toml", False


def read_config_file(path: Path, *, explicit: bool) -> dict[str, str]:
    """The file's `url`, `token` and `tenant`; {} for a default path that does not exist."""
    if not path.exists():
        if explicit:
            raise ConfigError(f"{ENV_CONFIG} names {path}, which does not exist")
        return {}
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(KEYS)}")
    values: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {key} must be a string")
        if value:
            values[key] = value
    return values


def check_url(url: str) -> str:
    """The base URL without a trailing slash; ConfigError unless it is http(s)."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
        raise ConfigError(f"the URL {url!r} must start with http:// or https://")
    return url


def resolve(
    *,
    url: str | None = None,
    token: str | None = None,
    tenant: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Flags (the arguments) beat the environment, which beats the config file."""
    env = os.environ if environ is None else environ
    path, explicit = config_path(env)
    from_file = read_config_file(path, explicit=explicit)
    flags = {"url": url, "token": token, "tenant": tenant}
    values: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for key in KEYS:
        for source, value in (
            ("flag", flags[key]),
            ("env", env.get(ENV[key])),
            ("file", from_file.get(key)),
        ):
            if value:
                values[key], sources[key] = value, source
                break
        else:
            values[key], sources[key] = None, "default"
    return Settings(
        url=check_url(values["url"] or DEFAULT_URL),
        token=values["token"],
        tenant=values["tenant"],
        sources=sources,
        config_path=path,
    )
