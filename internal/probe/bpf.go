package probe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

const (
	vmlinuxBTF   = "/sys/kernel/btf/vmlinux"
	jitSysctl    = "/proc/sys/net/core/bpf_jit_enable"
	xdpPass      = 2 // XDP_PASS
	testRunBytes = 64
)

// helperProbes are checked with features.HaveProgramHelper from a SchedCLS program (kedge's
// TC programs call them) - except the timer, which kedge also calls from XDP; TC suffices to
// show the helper exists. minimum is the first mainline kernel with the helper.
var helperProbes = []struct {
	id      string
	fn      asm.BuiltinFunc
	minimum string
}{
	{Timer, asm.FnTimerInit, "5.15"},
	{SkbSetTstamp, asm.FnSkbSetTstamp, "5.18"},
	{RedirectNeigh, asm.FnRedirectNeigh, "5.10"},
	{ForEachMapElem, asm.FnForEachMapElem, "5.13"},
	{Loop, asm.FnLoop, "5.17"},
}

// probeBPF fills the rows that need only the BPF syscall (no namespace).
func probeBPF(_ context.Context, found map[string]result) {
	found[BTF] = probeBTF()
	// Kernels with memcg accounting (5.11+) ignore RLIMIT_MEMLOCK; on older ones raising it
	// may fail without root, and then the loads below report EPERM.
	_ = rlimit.RemoveMemlock()

	sys := probeSyscall()
	found[BPFSyscall] = sys
	if !sys.available {
		dep := result{probed: sys.probed, detail: "needs the BPF syscall"}
		for _, id := range []string{BPFJIT, Ringbuf, ProgTestRun, EnableStats, TCX, Clsact, XDPNative, XDPGeneric} {
			found[id] = dep
		}
		for _, h := range helperProbes {
			found[h.id] = dep
		}
		return
	}
	found[BPFJIT] = probeJIT()
	found[Ringbuf] = fromErr(features.HaveMapType(ebpf.RingBuf), "ringbuf maps not supported (needs Linux 5.8)")
	for _, h := range helperProbes {
		found[h.id] = fromErr(features.HaveProgramHelper(ebpf.SchedCLS, h.fn),
			fmt.Sprintf("helper %s not supported (needs Linux %s)", helperName(h.fn), h.minimum))
	}
	found[ProgTestRun] = probeTestRun()
	found[EnableStats] = probeEnableStats()
}

// helperName turns asm.FnSkbSetTstamp into "bpf_skb_set_tstamp".
func helperName(fn asm.BuiltinFunc) string {
	s := strings.TrimPrefix(fn.String(), "Fn")
	var b strings.Builder
	b.WriteString("bpf")
	for _, r := range s {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func probeBTF() result {
	if _, err := os.Stat(vmlinuxBTF); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return no(vmlinuxBTF + " not found: kernel built without CONFIG_DEBUG_INFO_BTF")
		}
		return unknown(errText(err))
	}
	if _, err := btf.LoadKernelSpec(); err != nil {
		return no(fmt.Sprintf("parse %s: %v", vmlinuxBTF, err))
	}
	return yes("")
}

func probeSyscall() result {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "kedge_probe", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err == nil {
		m.Close()
		return yes("")
	}
	if errors.Is(err, unix.ENOSYS) {
		return no("bpf(2) returns ENOSYS: kernel built without CONFIG_BPF_SYSCALL")
	}
	return fromErr(fmt.Errorf("create array map: %w", err), "")
}

func loadTrivial(pt ebpf.ProgramType, ret int32) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "kedge_probe",
		Type:         pt,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, ret), asm.Return()},
	})
}

func probeJIT() result {
	setting := "absent"
	if b, err := os.ReadFile(jitSysctl); err == nil {
		setting = strings.TrimSpace(string(b))
	}
	prog, err := loadTrivial(ebpf.SocketFilter, 0)
	if err != nil {
		return fromErr(fmt.Errorf("load socket filter: %w", err), "")
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return unknown(fmt.Sprintf("read program info: %v (bpf_jit_enable=%s)", err, setting))
	}
	size, err := info.JitedSize()
	if err != nil {
		return unknown(fmt.Sprintf("read jited size: %v (bpf_jit_enable=%s)", err, setting))
	}
	if size == 0 {
		return no(fmt.Sprintf("programs run in the interpreter (bpf_jit_enable=%s)", setting))
	}
	return yes(fmt.Sprintf("bpf_jit_enable=%s", setting))
}

func probeTestRun() result {
	prog, err := loadTrivial(ebpf.XDP, xdpPass)
	if err != nil {
		return fromErr(fmt.Errorf("load xdp program: %w", err), "")
	}
	defer prog.Close()
	ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, testRunBytes), Repeat: 1})
	if err != nil {
		return fromErr(err, "BPF_PROG_TEST_RUN not supported for XDP (needs Linux 4.12)")
	}
	if ret != xdpPass {
		return no(fmt.Sprintf("test run returned %d, want %d", ret, xdpPass))
	}
	return yes("")
}

// probeEnableStats turns run-time statistics on and straight off again: the command exists
// only as an fd-scoped switch (the kernel counts while any such fd is open).
func probeEnableStats() result {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return no("BPF_ENABLE_STATS rejected with EINVAL (needs Linux 5.8)")
		}
		return fromErr(fmt.Errorf("enable stats: %w", err), "BPF_ENABLE_STATS not supported (needs Linux 5.8)")
	}
	if err := c.Close(); err != nil {
		return unknown(fmt.Sprintf("disable stats again: %v", err))
	}
	return yes("")
}
