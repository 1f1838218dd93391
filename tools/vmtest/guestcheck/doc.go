// Package guestcheck holds tests of a vmtest guest itself: the expected kernel booted,
// the modules loaded, BTF and bpffs are there, and netns, veth, netem, fq, clsact and
// BPF_PROG_TEST_RUN work. tools/vmtest runs them first on every kernel; outside a vmtest
// guest (no VMTEST_KERNEL_RELEASE in the environment) every test skips. It imports no kedge
// package (hence its own small netns helpers rather than internal/lab's), so a broken kedge
// package cannot make a broken guest look healthy or the other way round.
package guestcheck
