"""``dpsummary keygen | verify | inspect``: keys and signed artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .application import app
from .common import EXIT_FAILED, KEY_DEFAULT, guarded


@app.command()
@guarded
def keygen(
    directory: Annotated[Path | None, typer.Option("--dir", help="Where to write the key pair (default: the dpsummary home's keys/).")] = None,
    name: Annotated[str, typer.Option(help="File name stem of the key pair.")] = "dpsummary",
) -> None:
    """Create an Ed25519 signing key pair (private key file mode 0600) and print its key id."""
    from .. import keys

    info = keys.generate_keypair(directory or keys.default_key_dir(), name=name)
    typer.echo(f"private key: {info.private_path} (keep secret; mode 0600)")
    typer.echo(f"public key:  {info.public_path} (give this to analysts and auditors)")
    typer.echo(f"key id:      {info.keyid}")


@app.command()
@guarded
def verify(
    artifact: Annotated[Path, typer.Argument(help="A release artifact.")],
    key: Annotated[Path, typer.Option(help="The curator's PUBLIC key (.pub); a private key is refused.")],
) -> None:
    """Exit 0 only when ARTIFACT is intact and signed by KEY."""
    from .. import keys
    from ..artifact import read_artifact
    from .render import format_delta

    public = keys.load_public_key(key)
    _, claim, info = read_artifact(artifact, public)
    eps = claim.get("epsilon", {})
    typer.echo(f"OK: {artifact} is signed by key {info['keyid']} ({info['artifact_digest']}); "
               f"epsilon {eps.get('rdp', float('nan')):.4g} (RDP), delta {format_delta(claim.get('delta'))}")


@app.command()
@guarded
def inspect(
    artifact: Annotated[Path, typer.Argument(help="A release artifact.")],
    key: Annotated[Path | None, typer.Option(help=f"The curator's PUBLIC key (.pub) to verify with ({KEY_DEFAULT}).")] = None,
    allow_unsigned: Annotated[bool, typer.Option("--allow-unsigned", help="Show an artifact whose signature is missing or cannot be checked (marked UNVERIFIED).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """A human summary of a release: what was released, under which privacy claim."""
    from .. import keys
    from ..artifact import read_artifact
    from .render import inspect_lines, mechanism_rows

    public = keys.load_public_key(key) if key is not None else None
    body, claim, info = read_artifact(artifact, public, allow_unsigned=allow_unsigned)
    summary = body.get("summary", {})
    model = summary.get("model", {})
    weights = summary.get("weights", [])
    out = {
        "verified": info.get("verified"),
        "keyid": info.get("keyid"),
        "artifact_sha256": info.get("artifact_digest"),
        "created": body.get("created"),
        "software": body.get("software"),
        "model": model,
        "method": summary.get("method"),
        "pseudopoints": len(weights),
        "total_weight": sum(weights),
        "parameters": body.get("param_names"),
        "epsilon": claim.get("epsilon"),
        "delta": claim.get("delta"),
        "adjacency": claim.get("adjacency"),
        "sampling": claim.get("sampling"),
        "accountant_of_record": claim.get("accountant_of_record"),
        "mechanism": claim.get("mechanism"),
        "budget_split": claim.get("budget_split"),
        "public_inputs": claim.get("public_inputs"),
        "source_id": claim.get("source_id"),
        # What each mechanism released, in the words `dpsummary release` printed (one renderer).
        "released": [{"what": label, "detail": text} for label, text in mechanism_rows(claim)],
    }
    if json_output:
        typer.echo(json.dumps(out, indent=2))
        return
    status = "verified" if info.get("verified") else "UNVERIFIED (signature not checked)"
    typer.echo(f"{artifact}: {status}, key {info.get('keyid')}")
    for line in inspect_lines(body, claim):
        typer.echo(line)


@app.command()
@guarded
def audit(
    ledger: Annotated[Path, typer.Argument(help="The ledger (JSON Lines; the curator's is ledger.jsonl in the dpsummary home).")],
    key: Annotated[Path, typer.Option(help="The curator's PUBLIC key (.pub); a private key is refused.")],
    policy: Annotated[Path | None, typer.Option(help="Policy to compare each source's spending with (default: the packaged default policy; a source whose recorded deltas exceed its total_delta is composed at those deltas, and the report says so).")] = None,
    expect_head: Annotated[str | None, typer.Option("--expect-head", metavar="ENTRIES:sha256:HEX", help="A head printed by an earlier audit: fail unless the ledger still holds it (detects lines removed from the end).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Verify a ledger, recompute its epsilons and compare each source with the policy.

    Checks the chain and the signatures, recomputes every epsilon from the recorded events
    (Opacus RDP and dp-accounting PLD) and composes them per data source.
    Prints the ledger's head (entry count and hash of the last line): publish it, and pass it
    later as --expect-head. Open holds (releases in progress or crashed) are listed as warnings.
    Exits non-zero on any problem (an open hold or a torn tail alone is not one)."""
    from .. import keys
    from .. import policy as pmod
    from ..audit import audit as run_audit
    from ..audit import parse_head, wrong_key_message
    from .common import UserError

    if not ledger.exists():
        raise UserError(f"ledger not found: {ledger}; pass the ledger file (the curator's is "
                        f"{keys.default_home() / 'ledger.jsonl'} unless the release had --ledger)")
    if ledger.is_dir():
        raise UserError(f"{ledger} is a directory; pass the ledger file (ledger.jsonl)")
    try:
        expected = parse_head(expect_head) if expect_head is not None else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    public = keys.load_public_key(key)
    pol = pmod.load_policy(policy) if policy is not None else pmod.default_policy()
    report = run_audit(ledger, public, pol, policy_given=policy is not None, expect_head=expected,
                       policy_name=f"policy {policy}" if policy is not None else "")
    if report.wrong_key:
        raise UserError(wrong_key_message(report), code=EXIT_FAILED)
    typer.echo(report.to_json() if json_output else report.render_text())
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)
