#!/usr/bin/env bash
# The documentation site (`make docs`): MkDocs with the Material theme into site/, strict (a broken
# link or anchor, a page missing from the navigation, any warning fails the build).
# Arguments go to `mkdocs build` (e.g. -d /tmp/site); `make docs ARGS=serve` is not a build: use
# `.venv/bin/mkdocs serve` to preview.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

ensure_venv docs
# Material 9.7+ prints a notice about its successor on every build; it is not about this site.
export NO_MKDOCS_2_WARNING=1
exec .venv/bin/mkdocs build --strict "$@"
