#!/usr/bin/env bash
# The real Agent Inbox app (langchain-ai/agent-inbox) reviews Runsite runs, unchanged.
#
#   tools/agent_inbox/check.sh SOURCE        (or AGENT_INBOX_SRC=SOURCE make agent-inbox-check)
#
# SOURCE is where the app's code comes from: a checkout of the repository, a git directory (a bare
# or mirror clone: its HEAD is archived), or a git URL (cloned with --depth 1, e.g.
# https://github.com/langchain-ai/agent-inbox.git). Nothing else is fetched but npm packages.
#
# Steps: copy the source to $AGENT_INBOX_WORKDIR/app (default /tmp/agent-inbox-check), `npm install
# --legacy-peer-deps`, `next build` (both skipped when the same source was already built there;
# AGENT_INBOX_REBUILD=1 forces them), `next start` on a free port; Runsite as `make run` starts
# it (migrate, Daphne with the embedded worker, RUNS_API_AUTH=off) on a fresh SQLite database and
# a free port, with RUNS_CORS_ALLOWED_ORIGINS set to the app's origin and a `reviewer` user for its
# dashboard; then tools/agent_inbox/drive.py (Playwright, Debian's chromium) drives the app.
# One line per step; exit status 1 when any step failed. Both servers are stopped on exit.
# Screenshots, the app's requests to Runsite with the answers, and both servers' logs are left in
# $AGENT_INBOX_WORKDIR/artifacts.
#
# Environment: AGENT_INBOX_SRC, AGENT_INBOX_WORKDIR, AGENT_INBOX_REBUILD, CHROMIUM (default:
# chromium on PATH), AGENT_INBOX_PYTHON (default: .venv/bin/python of this repository),
# RUNSITE_DIR (default: this repository).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RUNSITE_DIR="${RUNSITE_DIR:-$(cd "$HERE/../.." && pwd)}"
PY="${AGENT_INBOX_PYTHON:-$RUNSITE_DIR/.venv/bin/python}"
SRC="${1:-${AGENT_INBOX_SRC:-}}"
WORK="${AGENT_INBOX_WORKDIR:-/tmp/agent-inbox-check}"
APP="$WORK/app"
ART="$WORK/artifacts"
CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
export NEXT_TELEMETRY_DISABLED=1

FAILED=0
PIDS=()
T0=$(date +%s)

say() { printf '%s\n' "$*"; }
ok() { say "ok   $1 ($(($(date +%s) - STEP_T0))s): ${2:-}"; }
fail() {
  say "FAIL $1 ($(($(date +%s) - STEP_T0))s): ${2:-}"
  if [ -n "${3:-}" ] && [ -f "$3" ]; then tail -n "${4:-30}" "$3" | sed 's/^/     | /'; fi
  FAILED=1
}
begin() { STEP_T0=$(date +%s); }
die() { fail "$@"; finish; }

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    # each server was started with setsid: stop its whole process group (next start forks)
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  PIDS=()
  if [ -n "${DB_DIR:-}" ]; then rm -rf "$DB_DIR"; fi  # a copy is in the artifacts
}
finish() {
  cleanup
  say "$( [ "$FAILED" = 0 ] && echo PASSED || echo FAILED ) in $(($(date +%s) - T0))s; artifacts in $ART"
  exit "$FAILED"
}
trap 'cleanup' EXIT
trap 'say "interrupted"; FAILED=1; finish' INT TERM

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_http() {  # URL PID SECONDS
  local end=$(($(date +%s) + $3))
  while [ "$(date +%s)" -lt "$end" ]; do
    kill -0 "$2" 2>/dev/null || return 1
    curl -fs -o /dev/null --max-time 2 "$1" && return 0
    sleep 0.5
  done
  return 1
}

# --- preconditions -------------------------------------------------------------------------------
begin
if [ -z "$SRC" ]; then
  die preconditions "no app source: give a path or git URL of langchain-ai/agent-inbox (argument or AGENT_INBOX_SRC)"
fi
for tool in node npm curl git setsid; do
  command -v "$tool" >/dev/null || die preconditions "$tool is not installed"
done
[ -x "$PY" ] || die preconditions "no Python at $PY (run make, or set AGENT_INBOX_PYTHON)"
[ -n "$CHROMIUM" ] && [ -x "$CHROMIUM" ] || die preconditions "no chromium (set CHROMIUM)"
"$PY" -c 'import playwright.sync_api, httpx, daphne' 2>/dev/null \
  || die preconditions "$PY lacks playwright/httpx/daphne (pip install -r requirements-dev.txt)"
mkdir -p "$WORK" && rm -rf "$ART" && mkdir -p "$ART"
ok preconditions "node $(node --version), npm $(npm --version), $CHROMIUM, Runsite at $RUNSITE_DIR"

# --- the app's source ----------------------------------------------------------------------------
begin
NEW="$WORK/src.new"
rm -rf "$NEW" && mkdir -p "$NEW"
if [[ "$SRC" =~ ^(https?|ssh|git)://|^git@|\.git$ ]] && [ ! -d "$SRC" ]; then
  git clone --quiet --depth 1 "$SRC" "$NEW/clone" >"$ART/source.log" 2>&1 \
    || die app-source "git clone $SRC failed" "$ART/source.log"
  REV=$(git -C "$NEW/clone" rev-parse HEAD)
  git -C "$NEW/clone" archive HEAD | tar -x -C "$NEW" && rm -rf "$NEW/clone"
elif [ -d "$SRC" ] && [ -f "$SRC/package.json" ]; then
  REV=$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo "worktree")
  tar -C "$SRC" --exclude=./node_modules --exclude=./.next --exclude=./.git -cf - . | tar -x -C "$NEW"
elif [ -d "$SRC" ] && git -C "$SRC" rev-parse --verify -q HEAD >/dev/null 2>&1; then
  REV=$(git -C "$SRC" rev-parse HEAD)
  git -C "$SRC" archive HEAD | tar -x -C "$NEW"
else
  die app-source "$SRC is neither a checkout (package.json), a git directory nor a git URL"
fi
[ -f "$NEW/package.json" ] && grep -q '"next"' "$NEW/package.json" \
  || die app-source "$SRC does not look like the Agent Inbox app (no Next.js package.json)"
FINGERPRINT=$(cd "$NEW" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
if [ "${AGENT_INBOX_REBUILD:-0}" != 1 ] && [ -f "$APP/.built-from" ] \
  && [ "$(cat "$APP/.built-from")" = "$FINGERPRINT" ] && [ -f "$APP/.next/BUILD_ID" ]; then
  REUSE=1
  rm -rf "$NEW"
  ok app-source "$SRC @ ${REV:0:12} (already built in $APP, source fingerprint $FINGERPRINT)"
else
  REUSE=0
  rm -rf "$APP" && mv "$NEW" "$APP"
  ok app-source "$SRC @ ${REV:0:12} → $APP"
fi

# --- npm install, next build --------------------------------------------------------------------
if [ "$REUSE" = 0 ]; then
  begin
  (cd "$APP" && npm install --legacy-peer-deps --no-audit --no-fund) >"$ART/npm-install.log" 2>&1 \
    || die npm-install "npm install failed" "$ART/npm-install.log"
  ok npm-install "$(ls "$APP/node_modules" | wc -l) top-level packages"
  begin
  # next/font/google would download the Inter font at build time: answered offline instead.
  (cd "$APP" && NEXT_FONT_GOOGLE_MOCKED_RESPONSES="$HERE/google-fonts-offline.js" npx next build) \
    >"$ART/next-build.log" 2>&1 || die next-build "next build failed" "$ART/next-build.log" 40
  echo "$FINGERPRINT" >"$APP/.built-from"
  ok next-build "$(grep -m1 'Compiled' "$ART/next-build.log" | sed 's/^[^A-Za-z]*//')"
fi

# --- the servers ---------------------------------------------------------------------------------
begin
APP_PORT=$(free_port)
RS_PORT=$(free_port)
APP_URL="http://127.0.0.1:$APP_PORT"
RS_URL="http://127.0.0.1:$RS_PORT"
DB_DIR=$(mktemp -d /tmp/agent-inbox-runsite.XXXXXX)
export DATABASE_URL="sqlite:///$DB_DIR/db.sqlite3"
(
  cd "$RUNSITE_DIR" \
    && "$PY" manage.py migrate --noinput \
    && "$PY" manage.py shell -c '
from django.contrib.auth.models import Group, User
from runs import services
services.groups_ensure()
u, _ = User.objects.get_or_create(username="reviewer")
u.set_password("reviewer"); u.save(); u.groups.add(Group.objects.get(name="Reviewers"))
'
) >"$ART/runsite-setup.log" 2>&1 || die runsite-start "migrate / user setup failed" "$ART/runsite-setup.log"
(
  cd "$RUNSITE_DIR" && exec env RUNS_EMBEDDED_WORKER=1 RUNS_API_AUTH=off DEBUG=1 \
    WHITENOISE_USE_FINDERS=1 ALLOWED_HOSTS=127.0.0.1,localhost \
    RUNS_CORS_ALLOWED_ORIGINS="$APP_URL,http://localhost:$APP_PORT" \
    setsid "$PY" -m daphne -b 127.0.0.1 -p "$RS_PORT" runsite.asgi:application
) >"$ART/runsite.log" 2>&1 &
RS_PID=$!
PIDS+=("$RS_PID")
wait_http "$RS_URL/healthz" "$RS_PID" 60 || die runsite-start "Daphne did not answer on $RS_URL" "$ART/runsite.log"
ok runsite-start "$RS_URL (SQLite $DB_DIR/db.sqlite3, CORS for $APP_URL)"

begin
(cd "$APP" && exec setsid npx next start -H 127.0.0.1 -p "$APP_PORT") >"$ART/next-start.log" 2>&1 &
APP_PID=$!
PIDS+=("$APP_PID")
wait_http "$APP_URL/" "$APP_PID" 90 || die app-start "next start did not answer on $APP_URL" "$ART/next-start.log"
ok app-start "$APP_URL"

# --- the scenario --------------------------------------------------------------------------------
"$PY" "$HERE/drive.py" --app "$APP_URL" --runsite "$RS_URL" --chromium "$CHROMIUM" \
  --user reviewer --password reviewer --artifacts "$ART" || FAILED=1

# --- Runsite's audit log: every decision the app made, named after the API client -------------
begin
(cd "$RUNSITE_DIR" && "$PY" manage.py shell -v 0 -c '
from runs.models import AuditEntry
for e in AuditEntry.objects.order_by("id"):
    via = (e.after or {}).get("via", "") if isinstance(e.after, dict) else ""
    print(e.actor, e.action, e.agent_id, via, f"({e.reason})" if e.reason else "")
') >"$ART/audit.txt" 2>&1
MISSING=""
for want in "approve refund agent_inbox:accept" "approve refund agent_inbox:edit" \
  "decline refund agent_inbox:response" "cancel_interrupt refund update_state:__end__" \
  "answer weather agent_inbox:response" "cancel_interrupt weather agent_inbox:ignore"; do
  grep -q "^api:[^ ]* $want" "$ART/audit.txt" || MISSING="$MISSING; $want"
done
if [ -z "$MISSING" ]; then
  ok runsite-audit "one entry per decision, by $(grep -o '^api:[^ ]*' "$ART/audit.txt" | sort -u | paste -sd, -): $(grep '^api:' "$ART/audit.txt" | cut -d' ' -f2,4 | paste -sd, -)"
else
  fail runsite-audit "no audit entry for${MISSING#;}" "$ART/audit.txt" 20
fi
"$PY" -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))' \
  "$DB_DIR/db.sqlite3" "$ART/runsite-db.sqlite3" 2>/dev/null
finish
