package bpftest

import "structs"

// SkBuff mirrors struct __sk_buff (vmlinux.h, Linux 6.18), the context of TC programs:
// BPF_PROG_TEST_RUN takes it in (only mark, priority, ingress_ifindex, ifindex, cb, tstamp,
// wire_len, gso_segs, gso_size and hwtstamp may be non-zero) and writes it back out. An older
// kernel's struct is a prefix of it: the kernel accepts the zero tail and writes back what it
// has. TestSkBuffLayout checks it against the running kernel's BTF.
type SkBuff struct {
	_                                              structs.HostLayout
	Len, PktType, Mark, QueueMapping, Protocol     uint32
	VlanPresent, VlanTCI, VlanProto, Priority      uint32
	IngressIfindex, Ifindex, TCIndex               uint32
	CB                                             [5]uint32
	Hash, TCClassid, Data, DataEnd, NapiID, Family uint32
	RemoteIP4, LocalIP4                            uint32
	RemoteIP6, LocalIP6                            [4]uint32
	RemotePort, LocalPort, DataMeta                uint32
	FlowKeys                                       uint64
	Tstamp                                         uint64
	WireLen, GSOSegs                               uint32
	Sk                                             uint64
	GSOSize                                        uint32
	TstampType                                     uint8
	_                                              [3]byte
	HWTstamp                                       uint64
}
