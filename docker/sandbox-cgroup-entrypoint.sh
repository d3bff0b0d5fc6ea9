#!/bin/sh
# Worker entrypoint (docker-compose.yml): prepares a delegated cgroup v2 parent for run_code's
# per-call caps, then runs the command as the unprivileged user `threads`.
#
# The container has a private cgroup namespace (compose `cgroup: private`): /sys/fs/cgroup is its
# own subtree. The no-internal-processes rule forbids enabling controllers for children of a
# cgroup that holds processes, so every process here moves to threads/worker (a leaf), and
# threads/sandbox, empty, gets +memory +pids for the calls' cgroups. `threads` owns threads/ (the
# common ancestor of where the worker is and where the sandboxes go, as moving a process needs).
set -eu
CG=/sys/fs/cgroup
if [ "$(id -u)" = 0 ] && [ -f "$CG/cgroup.controllers" ]; then
    # Docker mounts the cgroupfs read-only unless told otherwise; CAP_SYS_ADMIN can remount it.
    [ -w "$CG/cgroup.procs" ] || mount -o remount,rw "$CG" 2>/dev/null || true
    if [ -w "$CG/cgroup.procs" ]; then
        mkdir -p "$CG/threads/worker" "$CG/threads/sandbox"
        for pid in $(cat "$CG/cgroup.procs"); do echo "$pid" > "$CG/threads/worker/cgroup.procs" 2>/dev/null || true; done
        echo "+memory +pids" > "$CG/cgroup.subtree_control"
        echo "+memory +pids" > "$CG/threads/cgroup.subtree_control"
        echo "+memory +pids" > "$CG/threads/sandbox/cgroup.subtree_control"
        chown -R threads "$CG/threads"
    else
        echo "sandbox-cgroup-entrypoint: $CG is read-only; run_code will refuse to run code (see docs/workspace.md)" >&2
    fi
fi
if [ "$(id -u)" = 0 ]; then
    exec setpriv --reuid=threads --regid=threads --init-groups --inh-caps=-all -- "$@"
fi
exec "$@"
