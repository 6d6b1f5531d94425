#!/bin/sh
# A native tool, made by `soulbase init`. Soulbase writes the call's arguments as one
# JSON object on stdin and takes one JSON value on stdout as the result; a non-zero
# exit, a signal, or output that is not JSON fails the call.
#
# How it runs under the default isolation (sandbox.process_isolation: namespaces):
# - in fresh user, PID, mount, network, IPC and UTS namespaces, under Landlock and
#   seccomp, with rlimits and a scrubbed environment (PATH, LANG, HOME, TMPDIR);
# - its file tree holds only this script, the interpreter on its first line (the
#   executor allows a script's #! interpreter itself: nothing to grant for /bin/sh),
#   the shared libraries and a scratch directory; it has no network;
# - it can start no other program (seccomp refuses process creation: the tool's
#   profile names only its own command), so this script uses shell builtins only
#   (read, printf);
# - when soulbased runs as root, the tool runs as nobody (uid 65534): this file must
#   be readable, and every directory on the way to it searchable, by other users
#   (chmod o+rx hello.sh, chmod o+x on each directory).
input=
while IFS= read -r line || [ -n "$line" ]; do
  input="$input$line"
done
[ -n "$input" ] || input='{}'
printf '{"greeting": "hello from a native tool", "received": %s}\n' "$input"
