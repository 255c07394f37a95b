"""The `kind: Employee` spec (SPEC §3): parse, validate, name errors by field path.

Secrets appear only as references (a name resolved by the SecretStore), never as values.
"""

from __future__ import annotations

import re
import zoneinfo
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from eventos import names
from eventos.errors import SpecInvalid
from eventos.spec import content_rules, cron, yaml_strict

NAME_RE = r"^[a-z][a-z0-9-]{0,39}$"
REF_RE = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
PATH_RE = r"^[a-z0-9][a-z0-9._/-]{0,127}$"
# Prefixes of well-known secret values: a spec carrying one has pasted a secret, not a reference.
SECRET_VALUE_PREFIXES = ("sk-", "sk_", "whsec_", "ghp_", "github_pat_", "xox", "rk_live_", "eyj")

PROVIDER_SCHEMES = ("stripe", "github", "standard-webhooks", "whatsapp-business")
GENERIC_SCHEMES = ("header", "hmac-sha256", "none")
CHANNEL_KINDS = names.CHANNEL_KINDS

DEFAULT_CLASS = {
    "chat": names.C1_OWNER,
    "telegram": names.C2_CUSTOMER,
    "whatsapp_business": names.C2_CUSTOMER,
    "discord": names.C2_CUSTOMER,
    "email": names.C2_CUSTOMER,
    "grpc": names.C3_INTERNAL,
    "cron": names.C4_BACKGROUND,
    "poll": names.C4_BACKGROUND,
    "start": names.C4_BACKGROUND,
    "watch": names.C4_BACKGROUND,
}


# Validation context of a spec read back from the database (a generation's snapshot): checks
# added after it was stored do not apply again (its apply accepted it; run time reports).
STORED = "stored"


def _stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get(STORED))


def _check_ref(value: str) -> str:
    if value.lower().startswith(SECRET_VALUE_PREFIXES):
        raise ValueError("must be a secret reference (a name), not a secret value")
    if not re.match(REF_RE, value):
        raise ValueError(f"must be a secret reference matching {REF_RE}")
    return value


SecretRef = Annotated[str, Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelOptions(_Strict):
    """Request details a provider cannot guess. `token_limit_param` names the field that
    carries the token limit (by default `max_completion_tokens` for OpenAI's reasoning
    families o1/o3/o4/gpt-5, `max_tokens` otherwise)."""

    token_limit_param: Literal["max_tokens", "max_completion_tokens"] | None = None


class Model(_Strict):
    """Which model an agent calls. `endpoint` names one of the operator's LLM endpoints
    (EVENTOS_LLM_ENDPOINTS); a `base_url` must equal one's (apply checks both)."""

    provider: Literal["openai", "local"]
    name: str = Field(min_length=1)
    endpoint: str | None = Field(default=None, pattern=REF_RE)
    credential: SecretRef | None = None
    base_url: str | None = Field(default=None, max_length=2048)
    options: ModelOptions | None = None

    _ref = field_validator("credential")(lambda cls, v: v if v is None else _check_ref(v))

    @model_validator(mode="after")
    def _credential_for_openai(self) -> Model:
        given = (self.credential, self.base_url, self.endpoint)
        if self.provider == "openai" and given == (None, None, None):
            raise ValueError("provider openai needs an endpoint, a base_url or a credential")
        return self


HOST_RE = r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,62}\.)*[a-z0-9-]{1,63}$"


class HttpAuth(_Strict):
    """A credential the `http_request` tool attaches for a host, by secret reference."""

    scheme: Literal["bearer", "header"]
    secret: SecretRef
    header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")

    _ref = field_validator("secret")(lambda cls, v: _check_ref(v))

    @model_validator(mode="after")
    def _header_for_header(self) -> HttpAuth:
        if self.scheme == "header" and not self.header:
            raise ValueError("scheme header needs the header that carries the secret")
        return self


class HttpHost(_Strict):
    """A host `http_request` may reach: an exact name or `*.domain`; optionally a credential."""

    host: str = Field(pattern=HOST_RE, max_length=253)
    auth: HttpAuth | None = None


class Agent(_Strict):
    name: str = Field(pattern=NAME_RE)
    model: Model
    system: str = ""
    tools: list[str] = Field(default_factory=list, max_length=32)
    http_hosts: list[HttpHost] = Field(default_factory=list, max_length=64)
    # Shared stores the data tools may reach, besides those the employee's watch triggers name.
    data_stores: list[Annotated[str, Field(pattern=names.DATA_STORE_RE)]] = Field(
        default_factory=list, max_length=32
    )

    @field_validator("http_hosts", mode="before")
    @classmethod
    def _host_names(cls, v: object) -> object:
        """A bare name is a host without a credential."""
        if isinstance(v, list):
            return [{"host": h} if isinstance(h, str) else h for h in v]
        return v


class Verify(_Strict):
    scheme: Literal["header", "hmac-sha256", "stripe", "github", "standard-webhooks",
                    "whatsapp-business", "none"]  # fmt: skip
    secret: SecretRef | None = None
    header: str | None = None
    tolerance_s: int = Field(default=300, ge=1, le=3600)

    _ref = field_validator("secret")(lambda cls, v: v if v is None else _check_ref(v))

    @model_validator(mode="after")
    def _fields_per_scheme(self) -> Verify:
        if self.scheme != "none" and self.secret is None:
            raise ValueError(f"scheme {self.scheme} needs a secret reference")
        if self.scheme in ("header", "hmac-sha256") and not self.header:
            raise ValueError(f"scheme {self.scheme} needs the header that carries it")
        return self


# Poll triggers (SPEC §7 PollWorkflow): dotted JSON paths (a numeric segment indexes a list).
JSON_PATH_RE = r"^[A-Za-z0-9_$-]{1,64}(\.[A-Za-z0-9_$-]{1,64}){0,15}$"
QUERY_PARAM_RE = r"^[A-Za-z0-9_.\[\]-]{1,64}$"
HEADER_NAME_RE = r"^[A-Za-z0-9-]{1,64}$"
POLL_FIELDS = ("url", "cursor_param", "items_path", "cursor_path", "id_path", "auth")


class PollAuth(_Strict):
    """A poll's credential: `Authorization: Bearer <secret>` or `<header>: <secret>`."""

    scheme: Literal["bearer", "header"]
    secret: SecretRef
    header: str | None = Field(default=None, pattern=HEADER_NAME_RE)

    _ref = field_validator("secret")(lambda cls, v: _check_ref(v))

    @model_validator(mode="after")
    def _header_per_scheme(self) -> PollAuth:
        if (self.scheme == "header") != (self.header is not None):
            raise ValueError("scheme header needs a header; scheme bearer takes none")
        return self


def _check_poll_url(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http or https URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (use auth with a secret reference)")
    return value


def _raise_at(model: str, errors: list[tuple[str, str]], values: object) -> None:
    """Raise these (field, message) errors located at their fields (parse_spec's paths)."""
    if errors:
        details = [
            InitErrorDetails(type=PydanticCustomError("value_error", msg), loc=(f,),
                             input=getattr(values, f, None))
            for f, msg in errors
        ]  # fmt: skip
        raise ValidationError.from_exception_data(model, details)


# Fields only some trigger kinds read (any other kind would ignore them silently).
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "schedule": ("cron",),
    "interval_s": ("poll",),
    "text": ("cron", "start"),
    "path": ("webhook",),
    "verify": ("webhook",),
    "max_body": ("webhook",),
    "dedupe_header": ("webhook",),
    "account": CHANNEL_KINDS,
    "driver": ("grpc",),
    "store": ("watch",),
}


class Debounce(_Strict):
    window_s: float = Field(ge=0, le=600)
    cap_s: float = Field(ge=0, le=3600)


class Trigger(_Strict):
    kind: Literal["chat", "webhook", "telegram", "whatsapp_business", "discord", "email", "grpc",
                  "cron", "poll", "start", "watch"]  # fmt: skip
    name: str | None = Field(default=None, pattern=NAME_RE)
    agent: str | None = None
    class_: int | None = Field(default=None, alias="class", ge=1, le=4)
    thread_by: str | None = None
    debounce: Debounce | None = None
    on_busy: Literal["skip", "queue", "merge"] = "skip"
    filter: dict[str, Any] = Field(default_factory=dict)
    # webhook
    path: str | None = Field(default=None, pattern=PATH_RE)
    verify: Verify | None = None
    max_body: int | None = Field(default=None, ge=1, le=names.MAX_BODY_LIMIT)
    dedupe_header: str | None = None
    # channels
    account: str | None = None
    # grpc
    driver: str | None = Field(default=None, pattern=REF_RE)
    token: SecretRef | None = None  # the driver's token; default the reference driver-<driver>
    types: list[str] = Field(default_factory=list)
    # cron, poll, start
    schedule: str | None = None
    interval_s: int | None = Field(default=None, ge=10)
    text: str | None = None
    # poll (SPEC §7): an HTTP JSON endpoint read page by page
    url: str | None = Field(default=None, max_length=2048)
    cursor_param: str | None = Field(default=None, pattern=QUERY_PARAM_RE)
    items_path: str | None = Field(default=None, pattern=JSON_PATH_RE)
    cursor_path: str | None = Field(default=None, pattern=JSON_PATH_RE)
    id_path: str | None = Field(default=None, pattern=JSON_PATH_RE)  # default: the item's sha256
    auth: PollAuth | None = None
    # watch
    store: str | None = Field(default=None, pattern=names.DATA_STORE_RE)

    _token_ref = field_validator("token")(lambda cls, v: v if v is None else _check_ref(v))

    @field_validator("thread_by")
    @classmethod
    def _thread_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        """`event` or a dotted path into the event: anything else never places (routing)."""
        if (
            v is not None
            and not _stored(info)
            and (v == names.THREAD_BY_EXPLICIT or not re.match(JSON_PATH_RE, v))
        ):
            raise ValueError("must be `event` or a dotted path into the event (e.g. subject, "
                             "data.customer.id)")  # fmt: skip
        return v

    @field_validator("filter")
    @classmethod
    def _filter_pairs(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Dotted paths to a value or a list of values: a path with an empty part or a value
        routing cannot compare (an object) would silently never match."""
        for path, expected in {} if _stored(info) else v.items():
            if not re.match(JSON_PATH_RE, path):
                raise ValueError(f"filter key {path!r} must be a dotted path (e.g. data.kind)")
            values = expected if isinstance(expected, list) else [expected]
            if any(isinstance(x, dict | list) for x in values):
                raise ValueError(f"filter {path!r} takes a value or a list of values")
        return v

    @field_validator("types")
    @classmethod
    def _type_patterns(cls, v: list[str], info: ValidationInfo) -> list[str]:
        """`*`, an exact type or `prefix.*` (routing matches nothing else)."""
        for t in [] if _stored(info) else v:
            if not t or ("*" in t and t != "*" and not (t.endswith(".*") and "*" not in t[:-2])):
                raise ValueError(f"type {t!r}: use `*`, an exact type or a family `prefix.*`")
        return v

    _poll_url = field_validator("url")(lambda cls, v: _check_poll_url(v))

    @field_validator("class_", mode="before")
    @classmethod
    def _class_name(cls, v: object) -> object:
        if isinstance(v, str) and re.fullmatch(r"C[1-4]", v):
            return int(v[1])
        if isinstance(v, str):
            raise ValueError("class must be one of C1, C2, C3, C4")
        return v

    @model_validator(mode="after")
    def _fields_per_kind(self, info: ValidationInfo) -> Trigger:
        required = {"webhook": ("path", "verify"), "grpc": ("driver",), "cron": ("schedule",),
                    "poll": ("interval_s",), "watch": ("store",)}  # fmt: skip
        for kind in CHANNEL_KINDS:
            required[kind] = ("account",)
        for name in required.get(self.kind, ()):
            if getattr(self, name) is None:
                raise ValueError(f"a {self.kind} trigger needs {name!r}")
        if self.kind == "webhook":
            assert self.verify is not None
            if self.verify.scheme == "none" and not self.dedupe_header:
                raise ValueError("verify scheme none is only allowed with a dedupe_header")
        if self.token is not None and self.kind != "grpc":
            raise ValueError("only a grpc trigger takes a driver token")
        if not _stored(info):  # a field another kind takes would be silently ignored
            for field, kinds in KIND_FIELDS.items():
                if getattr(self, field) is not None and self.kind not in kinds:
                    raise ValueError(f"{field!r} is taken by a {' or '.join(kinds)} trigger "
                                     f"only, not a {self.kind} one")  # fmt: skip
        return self

    @field_validator("schedule")
    @classmethod
    def _runnable_cron(cls, v: str | None, info: ValidationInfo) -> str | None:
        """Refused at apply what Temporal would refuse later; a spec stored before this
        check (STORED) is read as it is: its Schedule's refusal is an attention item."""
        if v is None or _stored(info):
            return v
        try:
            return cron.check_cron(v)
        except cron.CronInvalid as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _poll_fields(self) -> Trigger:
        if self.kind != "poll":
            given = [f for f in POLL_FIELDS if getattr(self, f) is not None]
            _raise_at("Trigger", [(f, "only a poll trigger takes it") for f in given], self)
            return self
        errors = [(f, "a poll trigger needs it") for f in ("url", "items_path")
                  if getattr(self, f) is None]  # fmt: skip
        if self.interval_s is not None and self.interval_s < names.POLL_INTERVAL_MIN_S:
            errors.append(("interval_s", f"must be at least {names.POLL_INTERVAL_MIN_S} s"))
        if (self.cursor_param is None) != (self.cursor_path is None):
            missing = "cursor_param" if self.cursor_param is None else "cursor_path"
            errors.append((missing, "cursor_param and cursor_path go together"))
        _raise_at("Trigger", errors, self)
        return self

    @property
    def klass(self) -> int:
        """The scheduling class: explicit, else the default of the kind (SPEC §9)."""
        if self.class_ is not None:
            return self.class_
        if self.kind == "webhook":
            assert self.verify is not None
            provider = self.verify.scheme in PROVIDER_SCHEMES
            return names.C3_INTERNAL if provider else names.C4_BACKGROUND
        return DEFAULT_CLASS[self.kind]

    @property
    def token_ref(self) -> str | None:
        """A grpc trigger's driver token reference: explicit, else `driver-<driver id>`."""
        if self.kind != "grpc" or self.driver is None:
            return None
        return self.token or names.driver_token_ref(self.driver)

    @property
    def lane(self) -> str:
        if self.kind == "chat":
            return names.LANE_TALK
        return names.LANE_CUSTOMER if self.kind in CHANNEL_KINDS else names.LANE_WORKER


class Budget(_Strict):
    daily_usd: float = Field(gt=0, le=100_000)


SendKind = Literal["telegram", "whatsapp_business", "discord", "email"]
# Who decides a hold: the admin always; `user` also the user whose own chat raised it.
Decider = Literal["admin", "user"]


class Approvals(_Strict):
    """What needs the owner's approval before it happens (SPEC §11): replies on these channel
    kinds, these tools' calls; an approval not decided in `expire_after_h` hours expires (one
    reminder 24 h before). They are the admin's to decide; `decided_by: user` hands those
    raised in a user's own chat to that user too (SPEC §17)."""

    sends: list[SendKind] = Field(default_factory=list, max_length=8)
    tools: list[str] = Field(default_factory=list, max_length=32)
    expire_after_h: int = Field(default=names.APPROVAL_EXPIRE_AFTER_H, ge=25, le=720)
    decided_by: Decider = names.DECIDED_BY_ADMIN


RULE_FIELDS = {"keyword": "words", "regex": "pattern", "domain": "domains"}
RuleChannel = Literal["chat", "telegram", "whatsapp_business", "discord", "email"]


def _check_word(value: str) -> str:
    if not content_rules.normalise_text(value).split():
        raise ValueError("a keyword is blank")
    return value


def _check_domain(value: str) -> str:
    content_rules.normalise_domain(
        value
    )  # the form the rules compare; the spec keeps it as written
    return value


RuleWord = Annotated[
    str, Field(min_length=1, max_length=names.RULE_WORD_MAX_CHARS), AfterValidator(_check_word)
]
RuleDomain = Annotated[
    str, Field(min_length=1, max_length=names.DOMAIN_MAX_CHARS), AfterValidator(_check_domain)
]


def _customer_channels() -> list[RuleChannel]:
    return [kind for kind in get_args(RuleChannel) if kind in CHANNEL_KINDS]


class ContentRule(_Strict):
    """An owner's content rule (SPEC §11): an outgoing message it matches is held, its id the
    reason. `keyword` takes `words`, `regex` a `pattern` (RE2 syntax), `domain` `domains`. Its
    holds are the admin's to decide unless `decided_by: user` (then also the user's own)."""

    id: str = Field(pattern=NAME_RE)
    kind: Literal["keyword", "regex", "domain"]
    words: list[RuleWord] | None = Field(
        default=None, min_length=1, max_length=names.RULE_ITEMS_MAX
    )
    pattern: str | None = Field(default=None, min_length=1,
                                max_length=names.RULE_PATTERN_MAX_CHARS)  # fmt: skip
    domains: list[RuleDomain] | None = Field(default=None, min_length=1,
                                           max_length=names.RULE_ITEMS_MAX)  # fmt: skip
    # Customer channels by default; owner chat only when named.
    applies_to: list[RuleChannel] = Field(default_factory=_customer_channels, min_length=1)
    decided_by: Decider = names.DECIDED_BY_ADMIN

    @field_validator("id")
    @classmethod
    def _not_built_in(cls, v: str) -> str:
        if v in names.BUILTIN_RULES:
            raise ValueError(f"{v!r} is the id of a built-in rule")
        return v

    @field_validator("applies_to")
    @classmethod
    def _each_kind_once(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("names a channel kind twice")
        return v

    @model_validator(mode="after")
    def _fields_per_kind(self) -> ContentRule:
        own = RULE_FIELDS[self.kind]
        errors = [(f, f"only a {k} rule takes it") for k, f in RULE_FIELDS.items()
                  if f != own and getattr(self, f) is not None]  # fmt: skip
        if getattr(self, own) is None:
            errors.append((own, f"a {self.kind} rule needs it"))
        _raise_at("ContentRule", errors, self)
        try:
            self._compile_check()
        except ValueError as exc:
            _raise_at("ContentRule", [(own, str(exc))], self)
        return self

    def _compile_check(self) -> None:
        if self.words is not None:
            content_rules.keyword_regex(self.words)
        if self.pattern is not None:
            content_rules.compile_regex(self.pattern)
        if self.domains is not None:
            content_rules.domain_regex(self.domains)

    def size(self) -> int:
        """Characters of its words, pattern and domains (bounded per spec)."""
        return (
            sum(map(len, self.words or ()))
            + len(self.pattern or "")
            + sum(map(len, self.domains or ()))
        )


def resolve_flags(given: dict[str, Any] | None) -> dict[str, bool]:
    """Every documented flag (names.FLAGS) from a snapshot's `spec.flags`: its value when it is
    a boolean, else the default (a name no longer documented is left out)."""
    given = given if isinstance(given, dict) else {}
    return {name: given[name] if isinstance(given.get(name), bool) else default
            for name, (default, _) in names.FLAGS.items()}  # fmt: skip


class EmployeeBody(_Strict):
    timezone: str = "UTC"
    budget: Budget | None = None
    agents: list[Agent] = Field(min_length=1, max_length=16)
    triggers: list[Trigger] = Field(default_factory=list, max_length=64)
    approvals: Approvals | None = None
    content_rules: list[ContentRule] = Field(
        default_factory=list, max_length=names.CONTENT_RULES_MAX
    )
    # Documented names only (names.FLAGS), frozen in each generation; absent: every default
    # (and the stored spec, with its digest, stays as it was before flags existed).
    flags: dict[str, StrictBool] | None = Field(default=None, max_length=len(names.FLAGS))

    def resolved_flags(self) -> dict[str, bool]:
        """Every documented flag: the spec's value, else its default."""
        return resolve_flags(self.flags)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str, info: ValidationInfo) -> str:
        try:
            zoneinfo.ZoneInfo(v)
            if not _stored(info):  # an IANA name both Python and Temporal load
                cron.check_zone(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r}: use an IANA name such as "
                             "Europe/Paris") from None  # fmt: skip
        return v


class Metadata(_Strict):
    name: str = Field(pattern=NAME_RE)


class EmployeeSpec(_Strict):
    apiVersion: Literal["eventos/v1"]
    kind: Literal["Employee"]
    metadata: Metadata
    spec: EmployeeBody

    @property
    def name(self) -> str:
        return self.metadata.name

    def trigger_names(self) -> list[str]:
        """Each trigger's name: explicit, else derived from its kind and position."""
        out: list[str] = []
        for i, t in enumerate(self.spec.triggers):
            if t.name:
                out.append(t.name)
            elif t.kind in ("chat", "start"):
                out.append(t.kind)
            elif t.kind == "webhook" and t.path:
                out.append("webhook-" + re.sub(r"[^a-z0-9-]", "-", t.path))
            else:
                out.append(f"{t.kind.replace('_', '-')}-{i}")
        return out

    def webhook_paths(self) -> list[str]:
        return [t.path for t in self.spec.triggers if t.kind == "webhook" and t.path]


def _check_tools(spec: EmployeeSpec) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    for i, agent in enumerate(spec.spec.agents):
        for j, tool in enumerate(agent.tools):
            if tool not in names.TOOL_NAMES:
                known = ", ".join(sorted(names.TOOL_NAMES))
                errors.append((f"spec.agents[{i}].tools[{j}]",
                               f"unknown tool {tool!r}; known tools: {known}"))  # fmt: skip
        if "http_request" in agent.tools and not agent.http_hosts:
            errors.append((f"spec.agents[{i}].http_hosts",
                           "http_request needs the hosts it may reach"))  # fmt: skip
        errors += _check_data_tools(spec, i, agent)
    approvals = spec.spec.approvals
    for j, tool in enumerate(approvals.tools if approvals is not None else []):
        if tool not in names.TOOL_NAMES:
            errors.append((f"spec.approvals.tools[{j}]", f"unknown tool {tool!r}"))
    return errors


def _check_data_tools(spec: EmployeeSpec, i: int, agent: Agent) -> list[tuple[str, str]]:
    """A data tool needs a store: it writes its `data_stores`, reads those or a watched one."""
    watched = any(t.kind == "watch" for t in spec.spec.triggers)
    if "data_put" in agent.tools and not agent.data_stores:
        return [(f"spec.agents[{i}].data_stores", "data_put needs the stores it may write")]
    reads = [t for t in ("data_get", "data_list") if t in agent.tools]
    if reads and not (agent.data_stores or watched):
        return [(f"spec.agents[{i}].data_stores",
                 f"{reads[0]} needs a store: data_stores or a watch trigger")]  # fmt: skip
    return []


def _check_content_rules(spec: EmployeeSpec) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, rule in enumerate(spec.spec.content_rules):
        if rule.id in seen:
            errors.append((f"spec.content_rules[{i}].id", f"duplicate rule id {rule.id!r}"))
        seen.add(rule.id)
    total = sum(rule.size() for rule in spec.spec.content_rules)
    if total > names.RULES_TOTAL_MAX_CHARS:
        errors.append(("spec.content_rules",
                       f"words, patterns and domains total {total} characters; at most "
                       f"{names.RULES_TOTAL_MAX_CHARS}"))  # fmt: skip
    return errors


def _check_flags(spec: EmployeeSpec) -> list[tuple[str, str]]:
    known = ", ".join(sorted(names.FLAGS))
    return [(f"spec.flags.{name}", f"unknown flag {name!r}; known flags: {known}")
            for name in spec.spec.flags or {} if name not in names.FLAGS]  # fmt: skip


def _check_cross_fields(spec: EmployeeSpec) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = _check_tools(spec) + _check_content_rules(spec)
    agents = {a.name for a in spec.spec.agents}
    if len(agents) != len(spec.spec.agents):
        errors.append(("spec.agents", "agent names must be unique"))
    seen: set[str] = set()
    paths: set[str] = set()
    for i, (t, name) in enumerate(zip(spec.spec.triggers, spec.trigger_names(), strict=True)):
        if name in seen:
            errors.append((f"spec.triggers[{i}].name", f"duplicate trigger name {name!r}"))
        seen.add(name)
        if t.agent is not None and t.agent not in agents:
            errors.append((f"spec.triggers[{i}].agent", f"no agent named {t.agent!r}"))
        if t.path is not None:
            if t.path in paths:
                errors.append((f"spec.triggers[{i}].path", f"path {t.path!r} is declared twice"))
            paths.add(t.path)
    return errors


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith("function-") or part in ("function-after", "function-plain"):
            continue
        else:
            out += ("." if out else "") + part
    return out or "(root)"


def parse_spec(data: object, *, stored: bool = False) -> EmployeeSpec:
    """Validate a decoded spec; SpecInvalid lists every error with its field path. `stored`:
    a spec read back from the database, which its apply accepted (see STORED)."""
    if not isinstance(data, dict):
        raise SpecInvalid([("(root)", "an Employee spec must be a mapping")])
    try:
        spec = EmployeeSpec.model_validate(data, context={STORED: stored})
    except ValidationError as exc:
        errors = [
            (_loc(tuple(e["loc"])), e["msg"].removeprefix("Value error, ")) for e in exc.errors()
        ]
        raise SpecInvalid(errors) from None
    cross = _check_cross_fields(spec)
    if not stored:  # a flag a later release no longer documents takes no effect (resolve_flags)
        cross += _check_flags(spec)
    if cross:
        raise SpecInvalid(cross)
    return spec


def yaml_documents(text: str, source: str = yaml_strict.BODY) -> list[Any]:
    """The documents of a YAML text, strictly (eventos.spec.yaml_strict)."""
    return yaml_strict.documents(text, source)


def parse_specs(docs: list[Any]) -> list[EmployeeSpec]:
    """Every document as an Employee spec."""
    if not docs:
        raise SpecInvalid([("(root)", "no document found")])
    return [parse_spec(d) for d in docs]


def load_specs(text: str, source: str = yaml_strict.BODY) -> list[EmployeeSpec]:
    """Every Employee document in a YAML text (several may be separated by `---`)."""
    return parse_specs(yaml_documents(text, source))
