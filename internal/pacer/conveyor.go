package pacer

import (
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

// addFillers injects n filler frames into the conveyor's queue from a packet socket.
func (p *Pacer) addFillers(n int) error {
	if n <= 0 {
		return nil
	}
	return p.ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open packet socket: %w", err)
		}
		defer unix.Close(fd)
		// Fillers circulate forever and stay charged to this socket's send buffer.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 256<<20)
		frame := fillerFrame(p.opts.FillerBytes, p.devEndMAC)
		sa := &unix.SockaddrLinklayer{Ifindex: p.devIfx, Protocol: bpfx.Htons(fillerEthP), Halen: 6}
		copy(sa.Addr[:], p.devEndMAC)
		for i := 0; i < n; i++ {
			if err := unix.Sendto(fd, frame, 0, sa); err != nil {
				return fmt.Errorf("send filler %d/%d: %w", i+1, n, err)
			}
		}
		p.fillers += n
		return nil
	})
}

// fillerFrame is a conveyor filler frame of n bytes to dst (pacer_filler_of in
// bpf/pacer/frame.h): Ethernet with PACER_FILLER_ETH_P, then struct pacer_filler with its
// magic and no stamp yet (pacer_pass stamps it at its first pass).
func fillerFrame(n int, dst net.HardwareAddr) []byte {
	f, err := binary.Append(nil, binary.NativeEndian, pacerPacerFiller{Magic: fillerMagic})
	if err != nil {
		panic(fmt.Sprintf("encode struct pacer_filler: %v", err)) // a fixed-size struct of integers
	}
	b := make([]byte, max(n, ethHeaderLen+len(f)))
	copy(b[0:6], dst)
	copy(b[6:12], []byte{0x02, 'k', 'e', 'd', 'g', 'e'})
	binary.BigEndian.PutUint16(b[12:14], fillerEthP)
	copy(b[ethHeaderLen:], f)
	return b
}

// fillersFor returns how many fillers make a queue of one period at the conveyor's rate.
func (p *Pacer) fillersFor(period time.Duration) int {
	return int(math.Round(period.Seconds() * float64(p.rateBytes) / float64(p.opts.FillerBytes)))
}

// calibrateConveyor fills the conveyor so a pass takes the period, measuring the fillers'
// own round trips and correcting the filler count a few times.
func (p *Pacer) calibrateConveyor() error {
	target := p.opts.Period
	if err := p.addFillers(p.fillersFor(target)); err != nil {
		return err
	}
	p.cal.Target = target
	for round := 0; round < 6; round++ {
		mean, lo, hi, err := p.measurePeriod(max(3*target, 100*time.Millisecond))
		if err != nil {
			return err
		}
		p.cal.Mean, p.cal.Min, p.cal.Max = mean, lo, hi
		p.cal.Fillers = p.fillers
		off := mean - target
		p.opts.Log.Debug("conveyor calibration", "round", round, "fillers", p.fillers, "mean", mean, "target", target)
		if off.Abs() <= max(p.cal.Spread, target/50) {
			return nil
		}
		// Each filler adds one spread to the period.
		delta := int(math.Round(float64(-off) / float64(p.cal.Spread)))
		if delta > 0 {
			if err := p.addFillers(delta); err != nil {
				return err
			}
		} else if delta < 0 {
			if err := p.objs.PacerControl.Put(uint32(0), pacerPacerCtl{FillersToDrop: int32(-delta)}); err != nil {
				return fmt.Errorf("shrink conveyor: %w", err)
			}
			p.fillers += delta
		}
		p.cal.Fillers = p.fillers
	}
	p.opts.Log.Warn("conveyor calibration did not converge", "target", target, "mean", p.cal.Mean)
	return nil
}

// fillerWait is how much longer than its window measurePeriod waits for a first round trip.
const fillerWait = time.Second

// measurePeriod samples the conveyor's filler round trips over window.
func (p *Pacer) measurePeriod(window time.Duration) (mean, lo, hi time.Duration, err error) {
	before, err := p.counters()
	if err != nil {
		return 0, 0, 0, err
	}
	if err := p.resetMinMax(); err != nil {
		return 0, 0, 0, err
	}
	time.Sleep(window) // a measuring window, not synchronisation
	after, err := p.counters()
	if err != nil {
		return 0, 0, 0, err
	}
	// On a loaded machine the first round trips of fresh fillers can take longer than the
	// window (seen in make test with other packages' tests beside it): the window is
	// extended, up to fillerWait, until one is measured, before the fillers are given up on.
	for waited := time.Duration(0); after.PeriodCount == before.PeriodCount && waited < fillerWait; waited += window {
		time.Sleep(window)
		if after, err = p.counters(); err != nil {
			return 0, 0, 0, err
		}
	}
	n := after.PeriodCount - before.PeriodCount
	if n == 0 {
		return 0, 0, 0, fmt.Errorf("conveyor fillers are not circulating (no filler round trips measured in %v)", window+fillerWait)
	}
	return time.Duration((after.PeriodSumNs - before.PeriodSumNs) / n), time.Duration(after.PeriodMinNs), time.Duration(after.PeriodMaxNs), nil
}

// resetMinMax clears the per-CPU filler minima and maxima so a window's extremes are seen.
func (p *Pacer) resetMinMax() error {
	var per []pacerPacerStats
	if err := p.objs.PacerCounters.Lookup(uint32(0), &per); err != nil {
		return fmt.Errorf("read pacer counters: %w", err)
	}
	for i := range per {
		per[i].PeriodMinNs, per[i].PeriodMaxNs = 0, 0
	}
	if err := p.objs.PacerCounters.Put(uint32(0), per); err != nil {
		return fmt.Errorf("reset pacer counters: %w", err)
	}
	return nil
}
