"""``gpudash report RUN_DIR [-o report.html] [--format html|md|json] [--price-per-hour X]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpudash.analysis.cost import DEFAULT_PRICE_PER_HOUR
from gpudash.errors import UserError

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a run directory")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="where to write the report (default: report.html here for html, the terminal for md)")
    p.add_argument("--format", choices=("html", "md", "json"), default="html",
                   help='html (default), md, or json ({"facts": {...}, "verdicts": [...]})')
    p.add_argument("--price-per-hour", type=float, default=DEFAULT_PRICE_PER_HOUR, metavar="USD",
                   help=f"price of one GPU-hour for the cost estimate (default: {DEFAULT_PRICE_PER_HOUR:.2f})")


def run(args: argparse.Namespace) -> int:
    from gpudash.analysis.report import report_json, report_view
    from gpudash.analysis.summary import summarize
    from gpudash.store import load_run

    if args.price_per_hour < 0:
        raise UserError("--price-per-hour must be >= 0 (US$ per GPU-hour)")
    r = load_run(args.run_dir)
    try:
        verdicts = summarize(r, price_per_hour=args.price_per_hour)
        if args.format == "json":
            text = json.dumps(report_json(r, verdicts), indent=1, allow_nan=False)
            if args.output is None:
                sys.stdout.write(text + "\n")
                return 0
        elif args.format == "md":
            from gpudash.report import markdown_text

            text = markdown_text(report_view(r, verdicts, args.price_per_hour, figures=False))
            if args.output is None:
                sys.stdout.write(text + "\n")
                return 0
        else:
            from gpudash.report import html_page

            text = html_page(report_view(r, verdicts, args.price_per_hour))
        out = args.output or Path("report.html")
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot write {out}: {exc.strerror}; pass -o with a writable path") from exc
    finally:
        r.close()
    print(f"gpudash report: wrote {out}")
    return 0
