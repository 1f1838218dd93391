package pacer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"golang.org/x/sys/unix"
)

// openArmSocket opens the packet socket Arm sends tick requests through (the tick veth,
// so pacer_enter makes a tick of what it sends).
func (p *Pacer) openArmSocket() error {
	return netnsx.In(p.consumerNS, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open packet socket: %w", err)
		}
		p.armFD = fd
		return nil
	})
}

// Arm asks for a tick at deadline (CLOCK_MONOTONIC, as Now and bpf_ktime_get_ns), as
// pacer_request does from BPF: nothing happens when a tick at or before it is armed.
func (p *Pacer) Arm(deadline time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armFD < 0 || len(p.attached) == 0 {
		return errors.New("arm pacer: not started")
	}
	var st pacerPacerState
	if err := p.objs.PacerArming.Lookup(uint32(0), &st); err != nil {
		return fmt.Errorf("arm pacer: read state: %w", err)
	}
	now := Now()
	d := uint64(deadline)
	if st.ArmedNs != 0 && st.ArmedNs <= d && uint64(now) < st.ArmedNs+uint64(p.opts.LostAfter) {
		return nil
	}
	if err := p.objs.PacerArming.Update(uint32(0), pacerPacerState{ArmedNs: d, Seq: st.Seq + 1}, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("arm pacer: write state: %w", err)
	}
	frame := make([]byte, tickMinBytes)
	copy(frame[0:6], []byte{0x02, 'k', 'p', 'a', 'c', 'e'})
	copy(frame[6:12], []byte{0x02, 'k', 'p', 'a', 'c', 'e'})
	binary.BigEndian.PutUint16(frame[12:14], ethPPacer)
	sa := &unix.SockaddrLinklayer{Ifindex: p.tickIfx, Protocol: bpfx.Htons(ethPPacer), Halen: 6}
	if err := unix.Sendto(p.armFD, frame, 0, sa); err != nil {
		return fmt.Errorf("arm pacer: send tick request: %w", err)
	}
	return nil
}

// Now is CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns and of tick deadlines.
func Now() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// watchdog re-arms a tick that is overdue by LostAfter (lost in a qdisc, say) when no
// request came to do it. It reads one map value per LostAfter/2.
func (p *Pacer) watchdog() {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.LostAfter / 2)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		var st pacerPacerState
		if err := p.objs.PacerArming.Lookup(uint32(0), &st); err != nil || st.ArmedNs == 0 {
			continue
		}
		if uint64(Now()) >= st.ArmedNs+uint64(p.opts.LostAfter) {
			if err := p.Arm(time.Duration(st.ArmedNs)); err != nil {
				p.opts.Log.Warn("pacer watchdog: re-arm a lost tick", "err", err)
			} else {
				p.opts.Log.Debug("pacer watchdog: re-armed a lost tick", "deadline", st.ArmedNs)
			}
		}
	}
}

// closeArmSocket closes Arm's socket (Close; Arm then refuses).
func (p *Pacer) closeArmSocket() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armFD >= 0 {
		unix.Close(p.armFD)
		p.armFD = -1
	}
}
