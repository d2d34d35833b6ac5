"""`better_compute`'s pieces without a server: configuration precedence, the selector parser,
times, the error lines and the bars.

The selector parser is a copy of the server's syntax (the CLI never imports the
Django apps); the agreement test holds the two to the same answers.
"""

from __future__ import annotations

import argparse
import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from better_compute import render, render_capacity, render_reservations
from better_compute.arguments import parse_duration, parse_time
from better_compute.client import ApiError, Client, Unreachable
from better_compute.config import DEFAULT_URL, ConfigError, resolve
from better_compute.device_match import SelectorError, parse_selector
from capacity.cli_device_match import SelectorSyntaxError, parse_cli_selector
from reservations.request.device_match import selector_to_api

# --- Configuration ------------------------------------------------------------------


def write_config(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {"BETTER_COMPUTE_CONFIG": str(path)}


def test_nothing_set_gives_the_default_url_and_no_token(tmp_path: Path) -> None:
    settings = resolve(environ={"XDG_CONFIG_HOME": str(tmp_path)})
    assert settings.url == DEFAULT_URL
    assert settings.token is None and settings.tenant is None
    assert settings.config_path == tmp_path / "better-compute" / "config.toml"
    with pytest.raises(ConfigError, match="no API token"):
        settings.require_token()
    with pytest.raises(ConfigError, match="no tenant"):
        settings.require_tenant()


def test_the_file_gives_what_nothing_else_does(tmp_path: Path) -> None:
    env = write_config(tmp_path, 'url = "http://file:1/"\ntoken = "t-file"\ntenant = "file-co"\n')
    settings = resolve(environ=env)
    assert (settings.url, settings.token, settings.tenant) == ("http://file:1", "t-file", "file-co")
    assert dict(settings.sources) == {"url": "file", "token": "file", "tenant": "file"}


def test_the_environment_beats_the_file_and_flags_beat_both(tmp_path: Path) -> None:
    env = {
        **write_config(tmp_path, 'url = "http://file:1"\ntoken = "t-file"\ntenant = "file-co"\n'),
        "BETTER_COMPUTE_URL": "http://env:2",
        "BETTER_COMPUTE_TOKEN": "t-env",
    }
    settings = resolve(environ=env)
    assert (settings.url, settings.token, settings.tenant) == ("http://env:2", "t-env", "file-co")
    flagged = resolve(url="https://flag:3", tenant="flag-co", environ=env)
    assert (flagged.url, flagged.token, flagged.tenant) == ("https://flag:3", "t-env", "flag-co")
    assert dict(flagged.sources) == {"url": "flag", "token": "env", "tenant": "flag"}


def test_an_empty_variable_counts_as_unset(tmp_path: Path) -> None:
    env = {**write_config(tmp_path, 'token = "t-file"\n'), "BETTER_COMPUTE_TOKEN": ""}
    assert resolve(environ=env).token == "t-file"


def test_the_default_file_is_under_xdg_config_home(tmp_path: Path) -> None:
    path = tmp_path / "better-compute" / "config.toml"
    path.parent.mkdir()
    path.write_text('tenant = "xdg-co"\n')
    assert resolve(environ={"XDG_CONFIG_HOME": str(tmp_path)}).tenant == "xdg-co"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("token = ", "not valid TOML"),
        ('tokn = "x"\n', "unknown key"),
        ("tenant = 7\n", "tenant must be a string"),
        ('url = "ftp://x"\n', "must start with http"),
    ],
)
def test_a_bad_config_file_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(environ=write_config(tmp_path, text))


def test_a_named_config_file_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(environ={"BETTER_COMPUTE_CONFIG": str(tmp_path / "nope.toml")})


# --- Selectors ----------------------------------------------------------------------

AGREED = [
    "vramGiB >= 80",
    "vramGiB >= 80, gpuModel == H100",
    "gpuModel = H100, numaNode != 1",
    "vramGiB > 40, nvlinkDomain exists",
    "nvlinkDomain !exists",
    "gpuModel in (H200, H100, H100)",
    "numaNode notin (1, 0)",
    "gpuProduct == 'NVIDIA H100 80GB HBM3'",
    'gpuProduct == "a, (b)"',
    "migProfile == 3g.40gb, memoryGiB <= 40",
    "node.topology.kubernetes.io/zone == eu-1a",
    "vramGiB >= +80, numaNode < -1",
    "  vramGiB>=80 ,gpuModel==H100  ",
    "",
]


@pytest.mark.parametrize("text", AGREED)
def test_the_cli_parser_agrees_with_the_servers(text: str) -> None:
    assert parse_selector(text) == selector_to_api(parse_cli_selector(text))


@pytest.mark.parametrize(
    ("text", "api_form"),
    [
        (
            "vramGiB >= 80, gpuModel == H100, nvlinkDomain exists",
            {"vramGiB": {"gte": 80}, "gpuModel": {"eq": "H100"}, "nvlinkDomain": {"exists": True}},
        ),
        ("gpuModel in (H200, H100, H100)", {"gpuModel": {"in": ["H100", "H200"]}}),
        ('gpuModel == "80"', {"gpuModel": {"eq": "80"}}),
        # An attribute the CLI does not know is left to the server.
        ("coresPerGpu >= 132, fabric == ib-1", {"coresPerGpu": {"gte": 132}, "fabric": {"eq": "ib-1"}}),
    ],
)
def test_the_api_form(text: str, api_form: dict[str, Any]) -> None:
    assert parse_selector(text) == api_form


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vramGiB >= eighty", "needs an integer"),
        ("vramGiB >= '80'", "needs an integer"),
        ("gpuModel > H100", "compares integers"),
        ("vramGiB >=", "needs one value"),
        ("vramGiB >= 80 gpuModel == H100", "needs one value"),
        ("vramGiB >= 80, vramGiB <= 141", "already has a condition"),
        ("vramGiB", "is not `name op value`"),
        ("vramGiB >= 80,", "is empty"),
        ("numaNode in (0, x)", "needs an integer"),
    ],
)
def test_bad_selectors_name_the_clause(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message) as raised:
        parse_selector(text)
    assert all(problem.startswith("clause ") for problem in raised.value.problems)
    # The server refuses the same text.
    with pytest.raises(SelectorSyntaxError):
        parse_cli_selector(text)


def test_every_bad_clause_is_reported() -> None:
    with pytest.raises(SelectorError) as raised:
        parse_selector("vramGiB >= x, gpuModel > H100, numaNode == 1")
    assert len(raised.value.problems) == 2


# --- Times and durations ------------------------------------------------------------


def test_times_take_epoch_ms_iso_and_now() -> None:
    assert parse_time("1790000000000") == 1_790_000_000_000
    assert parse_time("2026-05-04T12:00:00Z") == int(datetime(2026, 5, 4, 12, tzinfo=UTC).timestamp() * 1000)
    assert parse_time("2026-05-04T14:00+02:00") == parse_time("2026-05-04T12:00Z")
    naive = datetime(2026, 5, 4, 12)  # local time, as the user's clock reads it
    assert parse_time("2026-05-04T12:00") == int(naive.timestamp() * 1000)
    assert abs(parse_time("now") - datetime.now().timestamp() * 1000) < 5_000


@pytest.mark.parametrize("text", ["1790000000", "tomorrow", "2026-13-01"])
def test_bad_times_are_usage_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time(text)


def test_durations_pass_through_and_seconds_are_numbers() -> None:
    assert parse_duration("1d") == "1d"
    assert parse_duration("PT8H") == "PT8H"
    assert parse_duration("3600") == 3600


def test_local_time_is_iso_8601_with_the_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert render.local_time(0) == "1970-01-01T05:30:00+05:30"
        assert render.local_time(None) == "-"
    finally:
        monkeypatch.undo()
        time.tzset()


# --- The client's answers -----------------------------------------------------------


class FakeResponse:
    def __init__(self, status: int, body: Any, content_type: str = "application/json") -> None:
        self.status_code = status
        self._body = body
        self.headers = {"Content-Type": content_type}
        self.text = body if isinstance(body, str) else repr(body)

    def json(self) -> Any:
        if isinstance(self._body, str):
            raise ValueError("not JSON")
        return self._body


def answer(response: FakeResponse) -> dict[str, Any]:
    return Client._answer("http://x/api/compute/capacity/summary", response)  # type: ignore[arg-type]


def test_an_object_with_2xx_is_the_answer() -> None:
    assert answer(FakeResponse(201, {"id": "rsv_1"})) == {"id": "rsv_1"}


def test_the_error_envelope_is_an_api_error() -> None:
    body = {"error": {"code": "NOT_FOUND", "message": "pool not found", "details": []}}
    with pytest.raises(ApiError) as raised:
        answer(FakeResponse(404, body))
    assert (raised.value.code, raised.value.message, raised.value.status) == (
        "NOT_FOUND",
        "pool not found",
        404,
    )


@pytest.mark.parametrize(
    "response",
    [
        FakeResponse(502, "<html>Bad Gateway</html>", "text/html"),
        FakeResponse(200, "", "text/plain"),
        FakeResponse(200, [1, 2]),
        FakeResponse(500, {"detail": "oops"}),
        FakeResponse(302, ""),
    ],
)
def test_anything_else_is_unreachable(response: FakeResponse) -> None:
    with pytest.raises(Unreachable, match="not the API's JSON"):
        answer(response)


# --- Rendering ----------------------------------------------------------------------


def test_error_lines_print_the_message_then_each_detail() -> None:
    assert render.error_lines(
        "INVALID_INPUT",
        "devices[0].count: must be between 1 and 64",
        [{"field": "devices[0].count", "message": "must be between 1 and 64"}, {"message": "and more"}],
    ) == [
        "error: INVALID_INPUT: devices[0].count: must be between 1 and 64",
        "  devices[0].count: must be between 1 and 64",
        "  and more",
    ]
    assert render.error_lines(
        "NO_CAPACITY", "no node", [{"field": "placement", "code": "NO_FIT", "message": "no node"}]
    ) == ["error: NO_CAPACITY: no node", "  placement: NO_FIT: no node"]


def test_rollup_bar_parts_fill_the_width_in_proportion() -> None:
    row = {"total": 8, "allocated": 2, "reserved": 2, "available": 2}
    bar = render.rollup_bar(row, width=16).plain
    assert bar == "████▓▓▓▓░░░░····"
    assert (
        render.rollup_bar({"total": 0, "allocated": 0, "reserved": 0, "available": 0}, width=4).plain
        == "····"
    )


def test_timeline_draws_one_bar_per_bucket() -> None:
    hour = 3_600_000
    start = 1_790_000_000_000 - 1_790_000_000_000 % hour
    buckets = [
        {"start": start + i * hour, "end": start + (i + 1) * hour, "booked": b, "free": 4 - b}
        for i, b in enumerate([4, 2, 0])
    ]
    out = Console(width=100, record=True, no_color=True, file=io.StringIO())
    render_capacity.timeline(
        out,
        {
            "poolId": "pool_x",
            "from": start,
            "to": start + 3 * hour,
            "stepMinutes": 60,
            "allocatable": 4,
            "buckets": buckets,
        },
    )
    text = out.export_text()
    bars = [line.split("│")[1] for line in text.splitlines() if "│" in line]
    assert [bar.count("█") * 4 // len(bar) for bar in bars] == [4, 2, 0]
    assert all(set(bar) <= {"█", "░"} for bar in bars)
    assert "peak: 4 booked" in text


SUMMARY: dict[str, Any] = {
    "tenantId": "acme",
    "pools": [
        {
            "poolId": "pool_01m8pwavjcwfchz4ehyv67tk2j",
            "name": "h100-east",
            "ownerTenantId": "acme",
            "offered": False,
            "archived": False,
            "gpuModel": "H100",
            "sharing": "exclusive",
            "capacity": [
                {
                    "poolId": "pool_01m8pwavjcwfchz4ehyv67tk2j",
                    "resource": "gpu",
                    "total": 123456,
                    "allocatable": 120000,
                    "allocated": 40000,
                    "reserved": 20000,
                    "available": 60000,
                    "provisioning": 0,
                    "unhealthy": 3456,
                    "maintenance": 0,
                    "unreachable": 0,
                    "updatedAt": 1_790_000_000_000,
                }
            ],
        }
    ],
    "byGpuModel": {
        "H100": {
            "total": 123456,
            "allocatable": 120000,
            "allocated": 40000,
            "reserved": 20000,
            "available": 60000,
        }
    },
}


@pytest.mark.parametrize("width", [200, 120, 100, 80, 60])
def test_ids_and_numbers_are_never_cut_on_a_narrow_terminal(width: int) -> None:
    for draw, answer in (
        (render_capacity.summary, SUMMARY),
        (
            render_capacity.pool_rows,
            {"poolId": SUMMARY["pools"][0]["poolId"], "rows": SUMMARY["pools"][0]["capacity"]},
        ),
    ):
        out = Console(width=width, no_color=True, file=io.StringIO())
        draw(out, answer)  # type: ignore[operator]
        text = out.file.getvalue()  # type: ignore[attr-defined]
        assert "pool_01m8pwavjcwfchz4ehyv67tk2j" in text
        for number in ("123456", "120000", "40000", "20000", "60000", "3456"):
            assert number in text
        assert "…" not in text


def test_an_at_risk_reservation_and_pool_say_so() -> None:
    out = io.StringIO()
    console = Console(file=out, width=160, color_system=None)
    reservation = {
        "id": "rsv_1",
        "state": "scheduled",
        "tenantId": "acme",
        "poolId": "pool_1",
        "atRisk": {"reason": "node gpu-a-001 is cordoned: xid 79; no other placement fits", "since": 0},
        "allocations": [],
    }
    render_reservations.reservation(console, reservation)
    render_capacity.pool_rows(console, {"poolId": "pool_1", "rows": [], "atRiskReservations": 0})
    text = out.getvalue()
    assert "at risk" in text and "node gpu-a-001 is cordoned: xid 79" in text
    row = {
        "resource": "gpu",
        **{k: 1 for k in ("total", "allocatable", "allocated", "reserved", "available")},
        **{k: 0 for k in ("provisioning", "unhealthy", "maintenance", "unreachable")},
        "updatedAt": 0,
    }
    out.truncate(0)
    render_capacity.pool_rows(console, {"poolId": "pool_1", "rows": [row], "atRiskReservations": 2})
    assert "2 reservations are at risk in this pool" in out.getvalue()
