"""Settings from the environment (12-factor), declared once with pydantic-settings.

Every knob is one field, declared in the group it belongs to (Redis, voices, admission,
reliability, places and processes, security, the canary, zones; `app/setting_groups.py`) and
read from a `VOXFARM_<FIELD>` variable (`VOXFARM_MEL_CACHE_TTL` for `mel_cache_ttl`). A field whose
variable is named otherwise says so with `Env(...)` (`store_dir` is `VOXFARM_STORE`);
`redis_url` also takes the conventional `REDIS_URL`. The groups are mixins of one flat
`Settings`, so code reads `settings.job_ttl` wherever the field sits.

Values are validated as they are read: types, ranges (a share is 0..1, a count never
negative), the embedded Redis's memory bound and the at-rest keyring, so a bad value stops the
process at start with one line that names its variable (`VOXFARM_JOB_TTL='soon': ...`).
Secrets (`flower_password`, `api_key`, `at_rest_keys`) are `SecretStr`: a `repr` or a log line
of the settings shows `**********`; `.get_secret_value()` is the one way in.

`Settings.from_env()` is the only reader of `VOXFARM_*` in the code base, and only the entry
points call it (the web factory's wsgi module and gunicorn config, `voxfarm worker` / the
worker module, the command line): everything else is handed its settings
(tests/unit/test_settings.py holds everyone to both). `Settings()` is the defaults alone,
whatever the environment, so a test builds the exact settings it needs and passes them to
`create_app()` / `make_celery()`.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.local.embedded_redis import maxmemory_bytes
from app.security.sealing import parse_keyring
from app.setting_groups import (
    PREFIX,
    AdmissionSettings,
    CanarySettings,
    Env,
    ProcessSettings,
    RedisSettings,
    ReliabilitySettings,
    SecuritySettings,
    VoiceSettings,
    ZoneSettings,
    _names,
)
from app.zones.ids import FARM_NAME_RULE, PeerConfig, is_farm_name, parse_peers

__all__ = ["PREFIX", "Env", "Settings"]


class _Environment(PydanticBaseSettingsSource):
    """The process environment, read by each field's variables: a field with several takes the
    first that is set and not empty; one variable set to "" means "" (and fails for a number)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        names = _names(field_name, field)
        if len(names) == 1:
            raw = os.environ.get(names[0])
        else:
            raw = next((v for v in map(os.environ.get, names) if v), None)
        return raw, field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name, info in self.settings_cls.model_fields.items():
            raw, _, _ = self.get_field_value(info, name)
            if raw is not None:
                values[name] = raw
        return values


# The groups in reverse: pydantic lists the fields of the last base first, so the settings
# print Redis first and the zones last, as they are declared above.
class Settings(ZoneSettings, CanarySettings, SecuritySettings, ProcessSettings,
               ReliabilitySettings, AdmissionSettings, VoiceSettings, RedisSettings,
               BaseSettings):
    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        # `Settings(...)` is the defaults and its arguments alone; `from_env()` reads the
        # environment (through _Environment) and passes it in as arguments.
        return (init_settings,)

    @field_validator("vocoder_yield", "auth_ops", "share_feature_cache", mode="before")
    @classmethod
    def _switch_by_word(cls, value: Any) -> Any:
        """A switch is read by its word; an empty variable is off, as before."""
        if isinstance(value, str) and not value.strip():
            return False
        return value

    @field_validator("embedded_redis_maxmemory")
    @classmethod
    def _maxmemory(cls, value: str) -> str:
        try:
            maxmemory_bytes(value)
        except ValueError as exc:
            raise ValueError(f"VOXFARM_EMBEDDED_REDIS_MAXMEMORY: {exc}") from None
        return value

    @field_validator("at_rest_keys")
    @classmethod
    def _keyring(cls, value: SecretStr) -> SecretStr:
        if value.get_secret_value().strip():
            try:
                parse_keyring(value.get_secret_value())
            except ValueError as exc:
                raise ValueError(f"VOXFARM_AT_REST_KEYS: {exc}") from None
        return value

    @field_validator("farm_name")
    @classmethod
    def _farm_name(cls, value: str) -> str:
        if value and not is_farm_name(value):
            raise ValueError(FARM_NAME_RULE)
        return value

    @field_validator("peers")
    @classmethod
    def _peers(cls, value: str) -> str:
        parse_peers(value)
        return value

    @model_validator(mode="after")
    def _zone(self) -> Settings:
        """Peers need this farm's name (its ids and the hop header carry it) and a credential
        the peers accept (the shared key, or a client certificate for mutual TLS)."""
        if self.peer_cert_key and not self.peer_cert:
            raise ValueError(f"{PREFIX}PEER_CERT_KEY is set without {PREFIX}PEER_CERT")
        peers = self.peer_list
        if not peers:
            return self
        if not self.farm_name:
            raise ValueError(f"{PREFIX}PEERS is set: {PREFIX}FARM_NAME (this farm's name, "
                             f"{FARM_NAME_RULE}) is required")
        if not (self.peer_key.get_secret_value() or self.peer_cert):
            raise ValueError(f"{PREFIX}PEERS is set: {PREFIX}PEER_KEY (the set's shared "
                             f"secret) or {PREFIX}PEER_CERT (mutual TLS) is required")
        if any(p.name == self.farm_name for p in peers):
            raise ValueError(f"{PREFIX}PEERS names this farm ({self.farm_name}) as a peer")
        return self

    @property
    def peer_list(self) -> tuple[PeerConfig, ...]:
        """The peers, parsed (validated when the settings were built)."""
        return parse_peers(self.peers)

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def broker_is_amqp(self) -> bool:
        """RabbitMQ (`amqp://`, `amqps://`, `pyamqp://`) rather than Redis."""
        return self.broker.split("://", 1)[0] in ("amqp", "amqps", "pyamqp")

    @property
    def result_backend(self) -> str:
        return self.result_url or self.redis_url

    @property
    def cache(self) -> str:
        return self.cache_url or self.redis_url

    @classmethod
    def env_names(cls) -> dict[str, tuple[str, ...]]:
        """Each field's environment variables, in order of precedence."""
        return {name: _names(name, info) for name, info in cls.model_fields.items()}

    @classmethod
    def from_env(cls) -> Settings:
        """The defaults, overridden by every variable that is set. Call it at an entry point
        only, and pass the settings down.

        A bad value fails here, at start, in one line with the variable's name:
        `VOXFARM_JOB_TTL='soon' is not a valid int: ...`.
        """
        raw = _Environment(cls)()
        try:
            return cls(**raw)
        except ValidationError as exc:
            raise _named(cls, exc, raw) from None

    def with_(self, **changes: Any) -> Settings:
        """A copy with `changes`, validated like the original."""
        values = {name: getattr(self, name) for name in type(self).model_fields}
        try:
            return type(self)(**{**values, **changes})
        except ValidationError as exc:
            raise _named(type(self), exc, changes) from None


def _named(cls: type[Settings], exc: ValidationError, raw: dict[str, Any]) -> ValueError:
    """The first error of `exc` as one line naming the field's variables and the value."""
    error = exc.errors()[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    if not field and message.startswith(PREFIX):
        return ValueError(message)  # a rule over several fields names its variables itself
    names = "/".join(cls.env_names().get(field, (field,)))
    kind = {"int_parsing": "int", "float_parsing": "float", "bool_parsing": "bool"}.get(
        error["type"], "")
    what = f"is not a valid {kind}" if kind else "is not valid"
    value = raw.get(field, error.get("input"))
    secret = field in cls.model_fields and isinstance(cls.model_fields[field].default, SecretStr)
    shown = "'**********'" if secret else repr(value)
    return ValueError(f"{names}={shown} {what}: {message}")
