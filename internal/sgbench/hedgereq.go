package sgbench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"
	"unsafe"

	isg "github.com/kedge-dev/kedge/internal/sg"
	"golang.org/x/sys/unix"
)

// The user-space baseline of the tail scenario (method "user-resend"; "user" is the same
// requester with re-sends off): the epoll baseline given kedge's re-send logic, written in
// user space as well as we can. Each requester owns one non-blocking UDP socket, one epoll
// instance and one timerfd (the request's timer: armed at the next round's due time or the
// deadline, whichever is first, with nanosecond resolution; epoll_wait's millisecond timeout
// would round every sub-millisecond delay up). A request's copies go out in one sendmmsg,
// each shard's to a replica picked round robin by request; when a round is due, every shard
// that has not answered gets its copy again in one sendmmsg - to the shard's next replica (a
// hedge) or, with none, to the same worker (a retry) - as long as the budget pays. The delay
// (fixed, or the client's q-quantile of reply times), the budget and the accounting mirror
// the data plane's (bpf/sg/stored.h, resend.h; docs/sg.md, "Re-sends"), shared by the
// client's requesters as the kernel's are by a group's requests.

// resendPolicy is the re-send state a client's requesters share.
type resendPolicy struct {
	delay, min time.Duration // the fixed delay (the adaptive one's ceiling) and the floor
	qMilli     uint64        // 0: fixed delay
	rounds     int
	ratioMilli int64 // budget: milli-copies deposited per copy scattered
	capMilli   int64
	tokens     atomic.Int64
	est        atomic.Uint64 // the quantile estimate (ns; 0: no sample yet)
	seq        atomic.Uint64 // requests, for the round robin
	c          resendCounters
}

// resendCounters are a client's re-send counters (kedge: the group's Stats).
type resendCounters struct {
	copies, retries, hedges, won, refused, late atomic.Int64
	rounds, lateNs, again, censored             atomic.Int64
}

func newResendPolicy(o ClientOptions) *resendPolicy {
	p := &resendPolicy{delay: o.Resend, min: o.ResendMin, qMilli: uint64(o.ResendQuantile*1000 + 0.5), rounds: max(o.MaxResends, 1),
		ratioMilli: int64(o.ResendRatio*1000 + 0.5), capMilli: int64(o.ResendBurst) * 1000}
	if p.qMilli > 0 && p.min == 0 {
		p.min = p.delay / 10
	}
	p.tokens.Store(p.capMilli) // the bucket starts full, as the kernel's
	return p
}

// deposit: a request of n copies pays into the budget (budget_deposit).
func (p *resendPolicy) deposit(n int) {
	if p.tokens.Load() < p.capMilli {
		p.tokens.Add(p.ratioMilli * int64(n))
	}
}

// take: one re-sent copy, paid or refused (budget_take); a repeat (again), or a retry
// (not hedge: the same worker again) past the round's first lateMax copies (sent of them so
// far), leaves half the cap saved (budget_keep).
func (p *resendPolicy) take(again bool, sent, lateMax int, hedge bool) bool {
	keep := int64(0)
	if again || (!hedge && sent >= lateMax) {
		keep = p.capMilli / 2
	}
	if p.tokens.Add(-1000) >= keep {
		return true
	}
	p.tokens.Add(1000)
	return false
}

// next is the delay to the next round (resend_delay).
func (p *resendPolicy) next() time.Duration {
	d := time.Duration(p.est.Load())
	if p.qMilli == 0 || d == 0 {
		return p.delay
	}
	return min(max(d, p.min), p.delay)
}

// again is the delay from a round to the next (resend_again_delay): with replicas and the
// adaptive delay, half of next, at least the floor.
func (p *resendPolicy) again(replicas bool) time.Duration {
	d := p.next()
	if !replicas || p.qMilli == 0 {
		return d
	}
	return max(d/2, p.min)
}

// sample steps the estimate by one reply time (quantile_step); unlocked in the kernel, a
// compare-and-swap here.
func (p *resendPolicy) sample(ns uint64) {
	if p.qMilli == 0 {
		return
	}
	for {
		m := p.est.Load()
		if p.est.CompareAndSwap(m, quantileStep(m, ns, p.qMilli)) {
			return
		}
	}
}

// censors: a round elapsed ns after the scatter re-sends shards whose reply times lie above
// the estimate (quantile_censors).
func (p *resendPolicy) censors(elapsed uint64) bool {
	m := p.est.Load()
	return p.qMilli > 0 && m > 0 && elapsed >= m
}

// up steps the estimate by a sample above it (quantile_up).
func (p *resendPolicy) up() {
	for {
		m := p.est.Load()
		if m == 0 || p.est.CompareAndSwap(m, quantileStep(m, m+1, p.qMilli)) {
			return
		}
	}
}

// quantileStep is bpf/sg/stored.h's quantile_step: the estimate moves by 1/32 of itself,
// up by q of that for a larger sample and down by 1-q for a smaller one.
func quantileStep(m, ns, qMilli uint64) uint64 {
	ns = max(ns, 1)
	if m == 0 {
		return ns
	}
	step := m>>5 + 1
	up, down := step*qMilli/1000+1, step*(1000-qMilli)/1000+1
	switch {
	case ns > m:
		return m + up
	case ns < m && m > down:
		return m - down
	case ns < m:
		return 1
	}
	return m
}

// hedgeReq is one requester of the user-space re-send baseline.
type hedgeReq struct {
	o      ClientOptions
	p      *resendPolicy
	fd     int
	epfd   int
	tfd    int
	nrep   int
	addrs  [][]netip.AddrPort // [replica][shard]
	names  [][]unix.RawSockaddrInet6
	nlen   [][]uint32
	reqs   [][]byte // per shard: the request with its worker (shard) index
	shdrs  []isg.Mmsghdr
	siovs  []unix.Iovec
	rhdrs  []isg.Mmsghdr
	riovs  []unix.Iovec
	rnames []unix.RawSockaddrInet6
	rbufs  [][]byte
	seen   []bool
	resent []bool
	ups    uint32  // samples above the estimate this request counted (quantile_claim_up)
	first  []uint8 // the replica each shard's first copy went to
	last   []uint8 // the replica its last copy went to
	acc    []int64
	size   int
}

func newHedgeReq(o ClientOptions, p *resendPolicy) (*hedgeReq, error) {
	n := len(o.Workers)
	h := &hedgeReq{o: o, p: p, fd: -1, epfd: -1, tfd: -1, addrs: [][]netip.AddrPort{o.Workers}, acc: make([]int64, o.Elems),
		size: o.elemType().Size(), seen: make([]bool, n), resent: make([]bool, n), first: make([]uint8, n), last: make([]uint8, n)}
	if len(o.Replicas) > 0 {
		h.addrs = append(h.addrs, o.Replicas)
	}
	h.nrep = len(h.addrs)
	v6 := !o.Workers[0].Addr().Unmap().Is4()
	fam := unix.AF_INET
	if v6 {
		fam = unix.AF_INET6
	}
	var err error
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	if h.fd, err = unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	_ = unix.SetsockoptInt(h.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	if h.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if h.tfd, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("timerfd_create: %w", err)
	}
	for _, fd := range []int{h.fd, h.tfd} {
		if err = unix.EpollCtl(h.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return nil, fmt.Errorf("epoll_ctl: %w", err)
		}
	}
	h.names = make([][]unix.RawSockaddrInet6, h.nrep)
	h.nlen = make([][]uint32, h.nrep)
	for r, as := range h.addrs {
		h.names[r] = make([]unix.RawSockaddrInet6, n)
		h.nlen[r] = make([]uint32, n)
		for i, a := range as {
			if !v6 {
				a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
			}
			h.nlen[r][i] = isg.PutSockaddr(&h.names[r][i], a)
		}
	}
	h.reqs = make([][]byte, n)
	for i := range h.reqs {
		hd := isg.Header{Version: isg.Version, Op: isg.OpRequest, Worker: uint16(i), PayloadLen: 5}
		h.reqs[i] = append(hd.Append(nil), "bench"...)
	}
	h.shdrs, h.siovs = make([]isg.Mmsghdr, n), make([]unix.Iovec, n)
	const batch = 64
	h.rhdrs, h.riovs, h.rnames, h.rbufs = make([]isg.Mmsghdr, batch), make([]unix.Iovec, batch), make([]unix.RawSockaddrInet6, batch), make([][]byte, batch)
	for i := range h.rbufs {
		h.rbufs[i] = make([]byte, 2048)
	}
	return h, nil
}

func (h *hedgeReq) close() {
	for _, fd := range []int{h.fd, h.epfd, h.tfd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// queue points send header k at shard i's copy for replica r.
func (h *hedgeReq) queue(k, i, r int) {
	h.siovs[k].Base = &h.reqs[i][0]
	h.siovs[k].SetLen(len(h.reqs[i]))
	h.shdrs[k].Hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&h.names[r][i])), Namelen: h.nlen[r][i], Iov: &h.siovs[k], Iovlen: 1}
	h.last[i] = uint8(r)
}

// send sends the first k queued copies (sendmmsg, retried while the socket buffer is full).
func (h *hedgeReq) send(k int) error {
	for off := 0; off < k; {
		r, err := isg.Sendmmsg(h.fd, h.shdrs[off:k], 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("sendmmsg: %w", err)
		}
		off += r
	}
	return nil
}

// arm sets the request's timer to fire at t (relative; a past t fires at once). Setting it
// also clears an expiry left from the previous request.
func (h *hedgeReq) arm(t time.Time) error {
	d := max(time.Until(t), time.Microsecond)
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	if err := unix.TimerfdSettime(h.tfd, 0, &spec, nil); err != nil {
		return fmt.Errorf("timerfd_settime: %w", err)
	}
	return nil
}

func (h *hedgeReq) do(id uint64) (int64, uint64, bool, error) {
	n := len(h.o.Workers)
	clear(h.seen)
	clear(h.resent)
	h.ups = 0
	clear(h.acc)
	for _, r := range h.reqs {
		binary.BigEndian.PutUint64(r[8:], id)
	}
	seq := h.p.seq.Add(1)
	for i := range n {
		r := int((seq + uint64(i)) % uint64(h.nrep))
		h.first[i] = uint8(r)
		h.queue(i, i, r)
	}
	t0 := time.Now()
	if err := h.send(n); err != nil {
		return 0, id, false, err
	}
	h.p.c.copies.Add(int64(n))
	resend := h.o.Resend > 0
	if resend {
		h.p.deposit(n)
	}
	deadline := t0.Add(h.o.Timeout)
	due, rounds := t0.Add(h.p.next()), 0
	next := func() time.Time {
		if resend && rounds < h.p.rounds && due.Before(deadline) {
			return due
		}
		return deadline
	}
	if err := h.arm(next()); err != nil {
		return 0, id, false, err
	}
	got := 0
	var ev [2]unix.EpollEvent
	for got < n {
		k, err := unix.EpollWait(h.epfd, ev[:], -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, id, false, fmt.Errorf("epoll_wait: %w", err)
		}
		// Replies first: a shard whose reply is already queued when the timer fires is
		// not re-sent.
		timer := false
		for _, e := range ev[:k] {
			if int(e.Fd) != h.fd {
				timer = true
				continue
			}
			if err := h.receive(id, t0, &got); err != nil {
				return 0, id, false, err
			}
		}
		if timer && got < n {
			var b [8]byte
			_, _ = unix.Read(h.tfd, b[:])
			now := time.Now()
			if !now.Before(deadline) {
				return h.acc[0], id, false, nil
			}
			if resend && rounds < h.p.rounds && !now.Before(due) {
				h.p.c.rounds.Add(1)
				h.p.c.lateNs.Add(now.Sub(due).Nanoseconds())
				if err := h.round(uint64(now.Sub(t0).Nanoseconds())); err != nil {
					return 0, id, false, err
				}
				rounds++
				due = now.Add(h.p.again(h.nrep > 1))
			}
			if err := h.arm(next()); err != nil {
				return 0, id, false, err
			}
		}
	}
	return h.acc[0], id, true, nil
}

// lateMax: how many of a request's shards lie above the estimate's quantile in the
// ordinary case, at most (quantile_late_max: 2 + 4 x shards x (1 - q)).
func (h *hedgeReq) lateMax() int {
	return 2 + len(h.seen)*int(1000-h.p.qMilli)/250
}

// claimUp: whether this request may count one more sample above the estimate
// (quantile_claim_up: at most lateMax).
func (h *hedgeReq) claimUp() bool {
	h.ups++
	return int(h.ups) <= h.lateMax()
}

// round re-sends every shard that has not answered, as far as the budget pays, elapsed ns
// after the scatter; a shard's first re-send is a sample above the delay estimate when the
// round began at or after it (bpf/sg/stored.h: re-sent workers are censored samples).
func (h *hedgeReq) round(elapsed uint64) error {
	k, censors, lateMax := 0, h.p.censors(elapsed), h.lateMax()
	for i, seen := range h.seen {
		if seen {
			continue
		}
		if !h.p.take(h.resent[i], k, lateMax, h.nrep > 1) {
			h.p.c.refused.Add(1)
			continue
		}
		r := int(h.last[i])
		if h.nrep > 1 {
			r = (r + 1) % h.nrep
			h.p.c.hedges.Add(1)
		} else {
			h.p.c.retries.Add(1)
		}
		if h.resent[i] {
			h.p.c.again.Add(1)
		} else if censors && h.claimUp() {
			h.p.up()
			h.p.c.censored.Add(1)
		}
		h.resent[i] = true
		h.queue(k, i, r)
		k++
	}
	return h.send(k)
}

// receive takes every queued datagram (recvmmsg until the socket is empty).
func (h *hedgeReq) receive(id uint64, t0 time.Time, got *int) error {
	for {
		for i := range h.rhdrs {
			h.riovs[i].Base = &h.rbufs[i][0]
			h.riovs[i].SetLen(len(h.rbufs[i]))
			h.rhdrs[i].Hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&h.rnames[i])), Namelen: unix.SizeofSockaddrInet6,
				Iov: &h.riovs[i], Iovlen: 1}
		}
		k, err := isg.Recvmmsg(h.fd, h.rhdrs, unix.MSG_DONTWAIT)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				return nil
			}
			return fmt.Errorf("recvmmsg: %w", err)
		}
		since := uint64(time.Since(t0).Nanoseconds())
		for i := range k {
			h.take(h.rbufs[i][:h.rhdrs[i].Len], &h.rnames[i], id, since, got)
		}
		if k < len(h.rhdrs) {
			return nil
		}
	}
}

// take reduces a reply to id from a shard that has not answered (from any of its
// replicas); a second reply of a re-sent shard is a late reply, as in the kernel.
func (h *hedgeReq) take(d []byte, from *unix.RawSockaddrInet6, id, since uint64, got *int) {
	hd, p, err := isg.ParseHeader(d)
	if err != nil || hd.Op != isg.OpReply || hd.ReqID != id || int(hd.Worker) >= len(h.seen) || len(p) != h.o.Elems*h.size {
		return // another request's reply (an earlier timeout), or not ours
	}
	i := int(hd.Worker)
	if h.seen[i] {
		if h.resent[i] {
			h.p.c.late.Add(1)
		}
		return
	}
	h.seen[i] = true
	*got++
	if !h.resent[i] {
		if m := h.p.est.Load(); m == 0 || since <= m || h.claimUp() {
			h.p.sample(since)
		}
	} else if h.nrep > 1 && !sameAddr(from, &h.names[h.first[i]][i]) {
		h.p.c.won.Add(1)
	}
	if h.size == 8 {
		for j := range h.acc {
			h.acc[j] += int64(binary.BigEndian.Uint64(p[j*8:]))
		}
	} else {
		for j := range h.acc {
			h.acc[j] += int64(int32(binary.BigEndian.Uint32(p[j*4:])))
		}
	}
}

// sameAddr: a and b (sockaddr_in or sockaddr_in6) hold the same address and port.
func sameAddr(a, b *unix.RawSockaddrInet6) bool {
	if a.Family != b.Family || a.Port != b.Port {
		return false
	}
	if a.Family == unix.AF_INET {
		return (*unix.RawSockaddrInet4)(unsafe.Pointer(a)).Addr == (*unix.RawSockaddrInet4)(unsafe.Pointer(b)).Addr
	}
	return a.Addr == b.Addr
}

func (c *resendCounters) load() ResendCounts {
	return ResendCounts{Copies: c.copies.Load(), Retries: c.retries.Load(), Hedges: c.hedges.Load(), HedgesWon: c.won.Load(),
		Refused: c.refused.Load(), LateReplies: c.late.Load(), Rounds: c.rounds.Load(), LateNs: c.lateNs.Load(), Again: c.again.Load(),
		Censored: c.censored.Load()}
}
