"""`better-compute`: the tenant's command line over the capacity API (HTTP only).

Each command is one API method (two when a pool is named by its name, or when
`--class` is left to the pool's sharing mode: then `capacity/summary` is read
first). `--json` prints the method's JSON answer unchanged; without it the
answer is drawn with rich. Exit codes are in EPILOG.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from better_compute import (
    __version__,
    maintenance,
    render,
    render_capacity,
    render_placement,
    render_reservations,
)
from better_compute.arguments import UsageError, parse_duration, parse_time, positive_int
from better_compute.client import ApiError, Client, Unreachable
from better_compute.config import DEFAULT_URL, ConfigError, Settings, resolve
from better_compute.device_match import SelectorError, parse_selector

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

EPILOG = f"""\
configuration (a flag beats the environment, which beats the file):
  --url     BETTER_COMPUTE_URL     url = "..."     default {DEFAULT_URL}
  --token   BETTER_COMPUTE_TOKEN   token = "..."   required
  --tenant  BETTER_COMPUTE_TENANT  tenant = "..."  required
  file: ~/.config/better-compute/config.toml, or the path in BETTER_COMPUTE_CONFIG

exit codes:
  0  ok
  1  the API refused (its error is printed: `error: CODE: message`, details one per line),
     or `capacity --preview` answered that the request does not fit
  2  usage or configuration error (a bad flag, a bad selector or time, no token, no tenant)
  3  the server could not be reached, or answered something that is not the API's JSON

times: --start, --from and --to take ISO-8601 (local time unless it names a zone),
epoch milliseconds, or `now`; durations (--for) take 90s, 45m, 8h, 1d, 2w, 1h30m, PT8H or seconds.
"""

CLASSES = ("gpu", "gpu.mig", "gpu.slot")
STATES = ("scheduled", "active", "ended", "released", "preempted")
# The device class a pool of each sharing mode sells (the server refuses the others).
CLASS_FOR_SHARING = render_capacity.HEADLINE
MAX_PAGES = 10_000


# --- The parser --------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--url, --token, --tenant and --json, on the top parser and again on every command.

    On the commands they default to SUPPRESS, so `better-compute --tenant acme capacity`
    and `better-compute capacity --tenant acme` both work and neither erases the other.
    """
    default = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("connection")
    group.add_argument("--url", default=default, help=f"the API's base URL (default {DEFAULT_URL})")
    group.add_argument("--token", default=default, help="the bearer token")
    group.add_argument("--tenant", default=default, help="the tenant to act as (tenantId)")
    group.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print the API's JSON answer unchanged",
    )


def _request_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """The reservation request's flags, shared by `capacity --preview` and `reserve`."""
    parser.add_argument("--gpus", type=int, required=required, help="how many devices of --class")
    parser.add_argument(
        "--for",
        dest="duration",
        type=parse_duration,
        required=required,
        metavar="DURATION",
        help="how long: 90s, 45m, 8h, 1d, 2w, 1h30m, PT8H, or seconds",
    )
    parser.add_argument(
        "--selector", help='device conditions, e.g. "vramGiB >= 80, gpuModel == H100, nvlinkDomain exists"'
    )
    parser.add_argument(
        "--class",
        dest="device_class",
        choices=CLASSES,
        help="the device class (default: the one the pool's sharing mode sells)",
    )
    parser.add_argument("--start", type=parse_time, help="when: ISO-8601, epoch ms or now (default now)")
    parser.add_argument("--project", help="the project (projectId) to book under")
    parser.add_argument(
        "--gang", type=positive_int, help="book --gpus on each of this many nodes sharing one fabric"
    )


# Adds one command: its name, its help, and the function that runs it.
AddCommand = Callable[[str, str, Callable[..., int]], argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="better-compute",
        description="The tenant's command line for the GPU capacity API.",
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _common(parser, top=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str, handler: Callable[..., int]) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=help_text, description=help_text, epilog=EPILOG, formatter_class=formatter
        )
        _common(sub, top=False)
        sub.set_defaults(handler=handler)
        return sub

    _capacity_command(command)
    _reserve_command(command)
    _reservation_commands(command)
    _list_command(command)
    _timeline_command(command)
    maintenance.add_commands(command, _common)
    return parser


def _capacity_command(command: AddCommand) -> None:
    capacity = command(
        "capacity",
        "The pools' capacity (capacity/summary), one pool's rows (--pool: capacity/byPool), "
        "a placement preview (--preview: capacity/preview), why not (--explain) or when (--earliest).",
        cmd_capacity,
    )
    capacity.add_argument("--pool", help="a pool id (pool_…) or name")
    capacity.add_argument(
        "--preview", action="store_true", help="would --gpus for --for fit in --pool now, and where?"
    )
    capacity.add_argument(
        "--explain",
        action="store_true",
        help="why not: how many nodes of --pool each filter removes, and why (capacity/explain)",
    )
    capacity.add_argument("--node", help="with --explain: explain this one node (node_…)")
    capacity.add_argument(
        "--earliest",
        action="store_true",
        help="when is the earliest start at which --gpus for --for fits in --pool? (capacity/earliest)",
    )
    capacity.add_argument(
        "--from", dest="search_from", type=parse_time, help="with --earliest: search from (default now)"
    )
    capacity.add_argument(
        "--horizon",
        type=parse_duration,
        help="with --earliest: how far past --from to search (up to 30d; default 7d)",
    )
    _request_options(capacity, required=False)


def _reserve_command(command: AddCommand) -> None:
    reserve = command("reserve", "Book devices (reservations/create).", cmd_reserve)
    reserve.add_argument("--pool", required=True, help="a pool id (pool_…) or name")
    _request_options(reserve, required=True)
    reserve.add_argument(
        "--key",
        help="the idempotency key: the same key and request answer the same reservation "
        "(default: a new random one, printed so that a retry can reuse it)",
    )
    reserve.add_argument(
        "--lease-seconds",
        type=positive_int,
        help="hold it only while renewed: `renew` within this many seconds (30-86400), or it ends",
    )
    reserve.add_argument(
        "--wait-ms",
        type=positive_int,
        help="how long the server may wait for capacity before NO_CAPACITY (0-30000)",
    )


def _reservation_commands(command: AddCommand) -> None:
    """`get`, `release` and `renew`: one reservation by its id, one method each."""
    for name, what in (
        ("get", "One reservation (reservations/get)."),
        ("release", "Release a reservation now (reservations/release)."),
        ("renew", "Renew a reservation's lease (reservations/renew)."),
    ):
        sub = command(name, what, cmd_reservation)
        sub.add_argument("reservation_id", metavar="RSV_ID", help="the reservation id (rsv_…)")
        sub.set_defaults(method=f"reservations/{name}")


def _list_command(command: AddCommand) -> None:
    listing = command("list", "The tenant's reservations, newest first (reservations/list).", cmd_list)
    listing.add_argument("--pool", help="only this pool (id or name)")
    listing.add_argument("--state", choices=STATES, help="only this state")
    listing.add_argument("--limit", type=int, help="at most this many per page (1-500; default 100)")
    listing.add_argument("--cursor", help="the page after this nextCursor")
    listing.add_argument(
        "--all",
        action="store_true",
        help="follow nextCursor to the last page (--json then prints one answer with every reservation)",
    )


def _timeline_command(command: AddCommand) -> None:
    timeline = command(
        "timeline",
        "Whole GPUs booked and free per time bucket in one pool (capacity/timeline), as a bar chart.",
        cmd_timeline,
    )
    timeline.add_argument("--pool", required=True, help="a pool id (pool_…) or name")
    timeline.add_argument(
        "--from", dest="start", type=parse_time, help="ISO-8601, epoch ms or now (default: this hour)"
    )
    timeline.add_argument(
        "--to", dest="end", type=parse_time, help="ISO-8601, epoch ms or now (default: --from + 24 h)"
    )
    timeline.add_argument("--step-minutes", type=int, help="bucket length, 5-1440 (default 60)")


# --- Running a command -------------------------------------------------------------


class Context:
    """What every command needs: the settings, the client, the output."""

    def __init__(self, args: argparse.Namespace, settings: Settings) -> None:
        self.args = args
        self.settings = settings
        # The operators' commands (`maintenance`) act on the platform: they need no tenant.
        self.tenant = settings.require_tenant() if getattr(args, "needs_tenant", True) else ""
        self.client = Client(settings.url, settings.require_token())
        self.as_json: bool = bool(args.json)
        self._summary: dict[str, Any] | None = None

    def call(self, method: str, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.client.call(method, {"tenantId": self.tenant, **body}, **kwargs)

    def print_json(self, answer: Any) -> None:
        sys.stdout.write(json.dumps(answer, indent=2, ensure_ascii=False) + "\n")

    def summary(self) -> dict[str, Any]:
        if self._summary is None:
            self._summary = self.call("capacity/summary", {})
        return self._summary

    def pool(self, text: str, *, need_sharing: bool = False) -> tuple[str, dict[str, Any] | None]:
        """The pool's id and, when the summary was read, its summary entry.

        An id is sent as it is (the server says NOT_FOUND when the tenant cannot
        see it); a name is looked up among the pools the tenant sees.
        """
        if text.startswith("pool_"):
            if not need_sharing:
                return text, None
            entry = next((p for p in self.summary()["pools"] if p["poolId"] == text), None)
            return text, entry
        named = [p for p in self.summary()["pools"] if p["name"] == text]
        if not named:
            raise ApiError(
                code="NOT_FOUND", message=f"no pool named {text!r} is visible to tenant {self.tenant}"
            )
        if len(named) > 1:
            ids = ", ".join(p["poolId"] for p in named)
            raise UsageError(f"{len(named)} pools are named {text!r} ({ids}); give the pool id")
        return named[0]["poolId"], named[0]


def _given(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields whose flag was given: the API's default stands for each one left out."""
    return {name: value for name, value in fields.items() if value is not None}


def _reservation_body(ctx: Context, args: argparse.Namespace, key: str) -> tuple[dict[str, Any], str]:
    """The reservation request (`capacity/preview`, `reservations/create`) and a line saying what it asks."""
    selector = None
    if args.selector:
        # Before any request: a selector that cannot be read is a usage error, whatever the server.
        try:
            selector = parse_selector(args.selector)
        except SelectorError as exc:
            raise UsageError("--selector: " + "\n  ".join(exc.problems)) from None
    pool_id, entry = ctx.pool(args.pool, need_sharing=args.device_class is None)
    device_class = args.device_class or CLASS_FOR_SHARING.get((entry or {}).get("sharing") or "", "gpu")
    device: dict[str, Any] = {"class": device_class, "count": args.gpus}
    if selector is not None:
        device["selector"] = selector
    body: dict[str, Any] = {
        "poolId": pool_id,
        "devices": [device],
        "duration": args.duration,
        "idempotencyKey": key,
    }
    if args.start is not None:
        body["start"] = args.start
    if args.project:
        body["projectId"] = args.project
    if args.gang:
        body["gang"] = {"size": args.gang}
    asked = f"{args.gpus} x {device_class} for {args.duration} in {pool_id}"
    if args.gang:
        asked = f"{args.gang} nodes x {asked}"
    if args.selector:
        asked += f" where {args.selector}"
    return body, asked


def _ask_placer(
    ctx: Context, method: str, *, extra: dict[str, Any], draw: Callable[..., None], answered: str
) -> int:
    """`capacity --preview` or `--explain`: the request's flags to `capacity/<method>`, drawn or as JSON.

    Exits 0 when the answer's `answered` field says something fits, else 1.
    """
    args = ctx.args
    if not args.pool or args.gpus is None or args.duration is None:
        raise UsageError(f"--{method} needs --pool, --gpus and --for")
    body, asked = _reservation_body(ctx, args, f"cli-{method}")
    answer = ctx.call(f"capacity/{method}", {**body, **extra})
    if ctx.as_json:
        ctx.print_json(answer)
    else:
        draw(render.console(), answer, asked=asked)
    return EXIT_OK if answer.get(answered) else EXIT_REFUSED


def cmd_capacity(ctx: Context) -> int:
    args = ctx.args
    request_flags = ("gpus", "duration", "selector", "device_class", "start", "project", "gang")
    if args.node and not args.explain:
        raise UsageError("--node goes with --explain")
    if (args.search_from is not None or args.horizon is not None) and not args.earliest:
        raise UsageError("--from and --horizon go with --earliest")
    if args.earliest:
        if args.start is not None:
            raise UsageError("--earliest chooses the start: give --from to search from")
        extra = _given({"from": args.search_from, "horizon": args.horizon})
        return _ask_placer(ctx, "earliest", extra=extra, draw=render_placement.earliest, answered="fits")
    if args.explain:
        extra = {"nodeId": args.node} if args.node else {}
        return _ask_placer(ctx, "explain", extra=extra, draw=render_placement.explain, answered="fit")
    if args.preview:
        return _ask_placer(ctx, "preview", extra={}, draw=render_placement.preview, answered="fits")
    given = [name for name in request_flags if getattr(args, name) is not None]
    if given:
        flags = ", ".join("--" + {"duration": "for", "device_class": "class"}.get(n, n) for n in given)
        raise UsageError(f"{flags} go(es) with --preview, --explain or --earliest")
    if args.pool:
        pool_id, entry = ctx.pool(args.pool)
        answer = ctx.call("capacity/byPool", {"poolId": pool_id})
        if ctx.as_json:
            ctx.print_json(answer)
        else:
            render_capacity.pool_rows(render.console(), answer, name=entry["name"] if entry else None)
        return EXIT_OK
    answer = ctx.summary()
    if ctx.as_json:
        ctx.print_json(answer)
    else:
        render_capacity.summary(render.console(), answer)
    return EXIT_OK


def cmd_reserve(ctx: Context) -> int:
    args = ctx.args
    key = args.key or uuid.uuid4().hex
    body, _ = _reservation_body(ctx, args, key)
    extra = 0.0
    if args.lease_seconds is not None:
        body["leaseSeconds"] = args.lease_seconds
    if args.wait_ms is not None:
        body["wait"] = {"timeoutMs": args.wait_ms}
        extra = args.wait_ms / 1000
    if not args.key:
        # Before the call: a retry after a lost answer must reuse it to get the same reservation.
        print(f"idempotency key: {key} (retry with --key {key})", file=sys.stderr)
    answer = ctx.call("reservations/create", body, extra_seconds=extra)
    if ctx.as_json:
        ctx.print_json(answer)
    else:
        render_reservations.reservation(render.console(), answer, title="Reserved")
    return EXIT_OK


def cmd_reservation(ctx: Context) -> int:
    answer = ctx.call(ctx.args.method, {"reservationId": ctx.args.reservation_id})
    if ctx.as_json:
        ctx.print_json(answer)
    else:
        titles = {"reservations/release": "Released", "reservations/renew": "Renewed"}
        render_reservations.reservation(
            render.console(), answer, title=titles.get(ctx.args.method, "Reservation")
        )
    return EXIT_OK


def cmd_list(ctx: Context) -> int:
    args = ctx.args
    body: dict[str, Any] = {}
    if args.pool:
        body["poolId"] = ctx.pool(args.pool)[0]
    if args.state:
        body["state"] = args.state
    if args.limit is not None:
        body["limit"] = args.limit
    if args.cursor:
        body["cursor"] = args.cursor
    answer = ctx.call("reservations/list", body)
    if args.all:
        reservations = list(answer["reservations"])
        seen: set[str] = set()
        cursor = answer.get("nextCursor")
        while cursor and cursor not in seen and len(seen) < MAX_PAGES:
            seen.add(cursor)
            page = ctx.call("reservations/list", {**body, "cursor": cursor})
            reservations.extend(page["reservations"])
            cursor = page.get("nextCursor")
        answer = {"reservations": reservations, "nextCursor": None}
    if ctx.as_json:
        ctx.print_json(answer)
    else:
        render_reservations.reservation_list(
            render.console(), answer["reservations"], more=bool(answer.get("nextCursor"))
        )
    return EXIT_OK


def cmd_timeline(ctx: Context) -> int:
    args = ctx.args
    body = _given(
        {
            "poolId": ctx.pool(args.pool)[0],
            "from": args.start,
            "to": args.end,
            "stepMinutes": args.step_minutes,
        }
    )
    answer = ctx.call("capacity/timeline", body)
    if ctx.as_json:
        ctx.print_json(answer)
    else:
        render_capacity.timeline(render.console(), answer)
    return EXIT_OK


def _error(*lines: str) -> None:
    sys.stdout.flush()
    for line in lines:
        print(line, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit code (EPILOG)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on a usage error, 0 after --help
    try:
        settings = resolve(url=args.url, token=args.token, tenant=args.tenant)
        handler: Callable[[Context], int] = args.handler
        return handler(Context(args, settings))
    except (ConfigError, UsageError) as exc:
        _error(f"{parser.prog}: error: {exc}")
        return EXIT_USAGE
    except ApiError as exc:
        _error(*render.error_lines(exc.code, exc.message, exc.details))
        return EXIT_REFUSED
    except Unreachable as exc:
        _error(f"error: {exc}")
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:
        # `better-compute list | head`: the reader left; nothing more to say, and
        # nothing for the interpreter to flush into the closed pipe on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
