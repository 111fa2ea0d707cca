#!/usr/bin/env bash
# Commit a finished run's DVC state (scripts/demo.sh ends with it): dvc.lock and stages/*/dvc.lock (every stage's
# deps and outs as the run recorded them, bertpipe/doors/dvc/dvclock.py), the files `dvc init` and `dvc add` wrote,
# and the generated dvc.yaml files and params_effective/ where the run changed them. `dvc metrics diff` and
# `dvc exp show` read HEAD's metrics through HEAD's dvc.lock: without it HEAD has none, and every experiment is
# compared with nothing. Only these paths go into the commit (anything else staged stays staged); nothing new to
# commit, not a git work tree, or no dvc.lock: it says so and commits nothing. `git reset --soft HEAD~1` undoes it.
#
#     bash scripts/dvc_baseline.sh [PROJECT_DIR]    # default: the current directory
set -euo pipefail
cd "${1:-.}"
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "dvc baseline: $(pwd) is not in a git work tree; nothing committed"
  exit 0
fi
if [ ! -f dvc.lock ]; then
  echo "dvc baseline: no dvc.lock (no run recorded one); nothing committed"
  exit 0
fi
paths=(dvc.lock 'stages/*/dvc.lock' dvc.yaml 'stages/*/dvc.yaml' params_effective '*.dvc' .dvc/config .dvc/.gitignore
       .dvcignore)
# new, changed, or staged and not committed (`dvc init` stages its files)
mapfile -t files < <({ git ls-files --others --modified --exclude-standard -- "${paths[@]}"
                       git diff --cached --name-only -- "${paths[@]}"; } | sort -u)
for f in "${files[@]}"; do  # `dvc add` writes a .gitignore beside each .dvc file
  if [[ $f == *.dvc && -f "$(dirname "$f")/.gitignore" ]]; then
    files+=("$(dirname "$f")/.gitignore")
  fi
done
if [ ${#files[@]} -eq 0 ]; then
  echo "dvc baseline: dvc.lock and the DVC files are committed already; nothing to commit"
  exit 0
fi
who=()  # a repo with no git identity (a fresh machine) still gets its baseline
git config user.email >/dev/null || who=(-c user.name="bertpipe" -c user.email="bertpipe@localhost")
git add -- "${files[@]}"
git ${who[@]+"${who[@]}"} commit -q -m "DVC baseline: dvc.lock of the finished run (scripts/dvc_baseline.sh)" -- "${files[@]}"
echo "dvc baseline: committed ${files[*]} ($(git rev-parse --short HEAD)); \`dvc exp run -S KEY=VALUE\` compares with it"
