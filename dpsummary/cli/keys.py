"""``dpsummary keygen | verify | inspect``: keys and signed artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .application import app
from .common import EXIT_FAILED, guarded


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
    key: Annotated[Path, typer.Option(help="The curator's PUBLIC key (.pub).")],
) -> None:
    """Exit 0 only when ARTIFACT is intact and signed by KEY."""
    from .. import keys
    from ..artifact import read_artifact

    public = keys.load_public_key(key)
    _, claim, info = read_artifact(artifact, public)
    eps = claim.get("epsilon", {})
    typer.echo(f"OK: {artifact} is signed by key {info['keyid']} ({info['artifact_digest']}); "
               f"epsilon {eps.get('rdp', float('nan')):.4g} (RDP), delta {claim.get('delta')}")


@app.command()
@guarded
def inspect(
    artifact: Annotated[Path, typer.Argument(help="A release artifact.")],
    key: Annotated[Path | None, typer.Option(help="Public key to verify with (default: the curator's own).")] = None,
    allow_unsigned: Annotated[bool, typer.Option(help="Show an unverified artifact (marked UNVERIFIED).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """A human summary of a release: what was released, under which privacy claim."""
    from .. import keys
    from ..artifact import read_artifact
    from .render import mechanism_rows

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
    typer.echo(f"  created {out['created']} by dpsummary {(out['software'] or {}).get('dpsummary')}")
    if "n_components" in model:  # a mixture: fitted by weighted VI, no Gaussian parameter prior
        typer.echo(f"  {out['method']} summary: {out['pseudopoints']} weighted pseudopoints, model {model.get('name')} "
                   f"with {model.get('n_components')} components over {model.get('num_features')} numeric columns")
    else:
        typer.echo(f"  {out['method']} summary: {out['pseudopoints']} weighted pseudopoints, model {model.get('name')} "
                   f"with {len(out['parameters'] or [])} parameters, prior N(0, {model.get('prior_scale')}^2 I)")
    eps = out["epsilon"] or {}
    typer.echo("  privacy: epsilon " + ", ".join(f"{k} {v:.4g}" for k, v in eps.items())
               + f"; delta {out['delta']:.3g}; {out['adjacency']}; {out['sampling']} sampling")
    for label, text in mechanism_rows(claim):
        typer.echo(f"  {label}: {text}")
    split = out["budget_split"] or {}
    typer.echo("  budget split: " + ", ".join(f"{k} {v:.4g}" for k, v in split.items()))
    typer.echo(f"  data source: {out['source_id']}; public inputs: {out['public_inputs']}")


@app.command()
@guarded
def audit(
    ledger: Annotated[Path, typer.Argument(help="The ledger (JSON Lines).")],
    key: Annotated[Path, typer.Option(help="The curator's PUBLIC key (.pub).")],
    policy: Annotated[Path | None, typer.Option(help="Policy to compare against (default: the default policy).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Verify a ledger's chain and signatures, recompute every epsilon from its recorded events
    (Opacus RDP and dp-accounting PLD), compose per data source and compare with the policy.
    Open holds (releases in progress or crashed) are listed as warnings. Exits non-zero on any
    problem (an open hold or a torn tail alone is not one)."""
    from .. import keys
    from .. import policy as pmod
    from ..audit import audit as run_audit

    if not ledger.exists():
        from .common import UserError

        raise UserError(f"ledger not found: {ledger}")
    public = keys.load_public_key(key)
    pol = pmod.load_policy(policy) if policy is not None else pmod.default_policy()
    report = run_audit(ledger, public, pol)
    typer.echo(report.to_json() if json_output else report.render_text())
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)
