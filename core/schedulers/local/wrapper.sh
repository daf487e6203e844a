# The wrapper of one replica of a local app, run by /bin/sh (see spawn.py):
#
#   sh wrapper.sh APP_DIR INDEX STDOUT_LOG STDERR_LOG CWD COMMAND [ARG...]
#
# It records the command's exit code in APP_DIR/exits ("INDEX CODE", one write), which the
# scheduler reads. Signals that reach it while the command runs only set $c, so it lives on to
# record the code; the command itself gets the default dispositions back (the subshell resets
# them).
trap 'c=129' HUP
trap 'c=130' INT
trap 'c=143' TERM
# A checkpoint signal (checkpoint_signal) goes to the replica's whole process group, this shell
# included, which must live on: it catches them (a caught signal is the default again in the
# command, which may catch it itself; an ignored one would stay ignored there).
trap ':' USR1 USR2 ALRM XCPU
d=$1 g=$2 out=$3 err=$4 cwd=$5
shift 5
# The start gate, fd 3: the submitter writes one line per replica once the app is recorded,
# after every replica was spawned (their start-up does not compete with the submit loop). An
# end of file instead means the submitter died first: then only an app that was recorded runs.
read _ <&3
exec 3<&-
[ -e "$d/app.json" ] || exit 0
exec >>"$out" 4>>"$d/exits"
if [ -n "$cwd" ]; then
    cd -- "$cwd" 2>>"$err" || { echo "$g 126" >&4; exit 126; }
fi
# A signal can reach the group before the command's process exists (a cancel right after
# submit): the trap only noted it. A canceller writes its marker before signalling, so a
# subshell that checked before the marker existed gets the signal itself.
(
    trap - HUP INT TERM
    [ -z "$c" ] && [ ! -e "$d/cancelled" ] && [ ! -e "$d/gang" ] || exit "${c:-143}"
    exec "$@" 2>>"$err" 4>&-
)
echo "$g $?" >&4
# What the command used, for when no process reaps this shell with its rusage (its submitter
# exited first): the CPU times of the shell's waited-for children (the command's); the file's
# time is when the command ended.
times >"$d/times.$g"
