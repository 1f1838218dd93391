#!/bin/busybox sh
# PID 1 of a vmtest guest (tools/vmtest). Sets the machine up, runs the test binaries
# listed in /vmtest/manifest and powers off. Lines starting with VMTEST- are markers the
# host parses; everything else is passed through.
#   VMTEST-SETUP-FAILED <what>      a mount or module load failed (the run fails)
#   VMTEST-MODPROBE <args>          the kernel tried to autoload a module the guest lacks
#   VMTEST-BOOTED uptime=<s>        setup done
#   VMTEST-BEGIN <pkg>              a test binary starts
#   VMTEST-END <pkg> rc=<n>         it exited with status n
#   VMTEST-DONE                     every binary ran; poweroff follows
/bin/busybox --install -s /bin
export PATH=/bin HOME=/root TMPDIR=/tmp

setup() {
	"$@" || echo "VMTEST-SETUP-FAILED $*"
}

setup mount -t proc proc /proc
setup mount -t sysfs sysfs /sys
setup mount -t devtmpfs devtmpfs /dev
setup mount -t tmpfs tmpfs /tmp
setup mount -t tmpfs tmpfs /run
setup mount -t bpf bpffs /sys/fs/bpf
setup mount -t cgroup2 cgroup2 /sys/fs/cgroup
setup mount -t debugfs debugfs /sys/kernel/debug
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null # present from 4.1, optional

. /vmtest/env
echo /vmtest/modprobe >/proc/sys/kernel/modprobe
for m in $VMTEST_MODULES; do
	setup insmod "/lib/modules/$m.ko"
done
setup ip link set lo up
echo "VMTEST-BOOTED uptime=$(cut -d' ' -f1 /proc/uptime)"

# run_test <pkg> <dir> <binary> <arg>...: runs one test binary from its package directory.
run_test() {
	pkg=$1 dir=$2 bin=$3
	shift 3
	echo "VMTEST-BEGIN $pkg"
	(cd "$dir" && exec "$bin" "$@") </dev/null 2>&1
	echo "VMTEST-END $pkg rc=$?"
}
. /vmtest/manifest
echo "VMTEST-DONE"

if [ "$VMTEST_SHELL" = 1 ]; then
	echo "vmtest: interactive shell; exit it to power off"
	setsid cttyhack sh
fi
poweroff -f
