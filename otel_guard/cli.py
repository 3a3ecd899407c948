"""The ``otel-guard`` command: ``demo``, ``keygen``, ``inspect`` and ``processor``.

Exit status: 0 on success, 2 on bad usage, 1 on failure (the reason goes to stderr).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Sequence

from otel_guard.chain import InvalidToken, decode, generate_key, generate_key_pair
from otel_guard.policy import integrity
from otel_guard.settings import ENV, current_settings


def _keygen(args: argparse.Namespace) -> int:
    """A shared secret (``hs256``): one line. A key pair: the signer's line, then its public JWK."""
    try:
        if args.alg == "hs256":
            kid, secret = generate_key(args.kid)
            print(f"{ENV['keys']}={kid}:{secret}")
            return 0
        kid, private, jwk = generate_key_pair(args.alg, args.kid)
    except ValueError as exc:
        if "cryptography" in str(exc):
            print(f"otel-guard keygen: {exc}", file=sys.stderr)
            return 1
        args.parser.error(f"--kid: {exc}")
    print(f"{ENV['keys']}={kid}:{private}")
    print(json.dumps(jwk, separators=(",", ":")))
    return 0


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def _inspect(args: argparse.Namespace) -> int:
    """The token as the guard reads it: the same verification, workspace and lifetime included."""
    try:
        settings = current_settings()
    except ValueError as exc:
        print(f"otel-guard inspect: {exc}", file=sys.stderr)
        return 1
    try:
        chain = decode(args.token, settings.keys)  # as it arrives: the guard strips nothing either
    except InvalidToken as exc:
        print(f"otel-guard inspect: bad_signature: {exc}", file=sys.stderr)
        return 1
    signed = "unsigned (no keys configured: the signature was not checked)"
    if settings.keys is not None:
        signed = "signature verified"
    print(f"root:       {chain.root}")
    print(f"workspace:  {chain.workspace}")
    print(f"issued at:  {_when(chain.issued_at)}")
    print(f"expires at: {_when(chain.expires_at)}")
    print(f"status:     {signed}")
    print(f"hops:       {chain.depth}")
    for number, hop in enumerate(chain.hops, start=1):
        skill = f"  (skill {hop.skill})" if hop.skill is not None else ""
        kind = "  (transfer)" if hop.kind == "transfer" else ""
        print(f"  {number}. {hop.agent}{skill}{kind}")
    problem = integrity(chain, settings, time.time())
    if problem is not None:
        reason, message = problem
        print(f"otel-guard inspect: {reason}: {message}; the guard refuses it", file=sys.stderr)
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.stack:
        from otel_guard._demo.stack import run_stack_demo

        return run_stack_demo()
    from otel_guard._demo.travel import run_demo

    run_demo()
    return 0


def _processor(argv: Sequence[str]) -> int:
    try:
        from otel_guard_processor.cli import main as processor_main
    except ImportError as exc:
        print(
            f"otel-guard processor: the processor is not installed ({exc}); install it with: "
            "pip install 'otel-guard[processor]' (from a checkout: pip install ./processor '.[processor]'; "
            "building it needs a Rust toolchain, https://rustup.rs)",
            file=sys.stderr,
        )
        return 1
    return processor_main(list(argv))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-guard",
        description="Stop AI agents from delegating in loops, and see every loop in OpenTelemetry.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="run the Planner / Budget example and an A -> A runaway, offline",
        description="Run the Planner / Budget example under the default rule, the strict rule and "
        "observe mode, then an A -> A runaway stopped by the name-depth backstop. No servers, "
        "no keys needed.",
    )
    demo.add_argument(
        "--stack",
        action="store_true",
        help="the same loop across two agent processes over HTTP, with signed chains, exported to a "
        "processor this starts; prints its metrics and the trace (needs the processor extra)",
    )
    demo.set_defaults(run=_demo, parser=demo)

    keygen = commands.add_parser(
        "keygen",
        help="print a fresh signing key as OTEL_GUARD_KEYS=kid:secret (or a key pair: --alg ed25519)",
        description="Print a fresh key. --alg hs256 (the default): a shared secret (32 random bytes, "
        "base64url) as OTEL_GUARD_KEYS=kid:secret, which every process sets. --alg ed25519 or es256: "
        "a service's own key pair, as two lines: OTEL_GUARD_KEYS=kid:EdDSA:<d> (or kid:ES256:<d>), "
        "the private key that only this service sets, then the public JWK, which goes into the "
        '{"keys": [...]} file the verifiers name in OTEL_GUARD_JWKS (needs the keys extra: '
        "pip install 'otel-guard[keys]'). To rotate, list the new key first and keep the old one after "
        "it until every process has it.",
    )
    keygen.add_argument("--kid", help="the key id (default: a random one)")
    keygen.add_argument(
        "--alg",
        choices=("hs256", "ed25519", "es256"),
        default="hs256",
        type=str.lower,
        help="hs256: a shared secret (default); ed25519 (EdDSA) or es256: a key pair",
    )
    keygen.set_defaults(run=_keygen, parser=keygen)

    inspect = commands.add_parser(
        "inspect",
        help="verify a chain token with the configured keys and print it",
        description="Verify TOKEN as the guard does, with the settings in the environment "
        f"({ENV['keys']}, {ENV['workspace']}, {ENV['ttl']}), and print its root, workspace, "
        "times and hops. Exit status 1 and the reason on stderr for a token the guard would refuse.",
    )
    inspect.add_argument(
        "token",
        metavar="TOKEN",
        help="the value of the otel_guard.chain member of a request's W3C baggage header "
        "(baggage: otel_guard.chain=eyJ...), URL-decoded",
    )
    inspect.set_defaults(run=_inspect, parser=inspect)

    commands.add_parser(
        "processor",
        help="run the collector-side processor (see: otel-guard processor --help)",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["processor"]:
        return _processor(arguments[1:])
    parser = build_parser()
    args, unknown = parser.parse_known_args(arguments)
    if unknown:
        # The command's own usage, not the top level's: `otel-guard demo --bogus` shows demo's.
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    result: int = args.run(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
