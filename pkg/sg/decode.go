package sg

import (
	"encoding/binary"
	"math"
	"time"

	isg "github.com/kedge-dev/kedge/internal/sg"
)

func (g *Group) decode(rec *isg.ResultRec, w *waiter, by int) Result {
	r := Result{
		Reader:    readerNames[by],
		ID:        rec.ReqId,
		Status:    Status(rec.Status),
		Count:     int(rec.Count),
		Need:      int(rec.Need),
		Overflow:  rec.Flags&isg.FlagOverflow != 0,
		Kernel:    time.Duration(rec.DoneNs - rec.StartNs),
		RoundTrip: time.Since(w.sent),
	}
	r.Answered = make([]int, 0, r.Count)
	for i, word := range rec.Bitmap {
		for b := 0; b < 64 && word != 0; b++ {
			if word&(1<<b) != 0 {
				r.Answered = append(r.Answered, i*64+b)
				word &^= 1 << b
			}
		}
	}
	if rec.Partial > 0 {
		r.Partial = g.partials(rec)
	}
	switch g.cfg.Reduction {
	case Sum, Min, Max:
		if g.cfg.Reduction == Sum || r.Count > 0 || len(r.Partial) > 0 {
			r.Values = append([]int64(nil), rec.Agg[:g.cfg.Elems]...)
		}
		var cover []bool
		if g.cfg.Reduction != Sum && r.Count == 0 && len(r.Partial) > 0 {
			cover = covered(len(r.Values), r.Partial)
		}
		if g.cfg.Type.IsFloat() && r.Values != nil {
			r.Floats = g.cfg.floats(r.Values, r.Count)
			r.Values = nil
			for i, ok := range cover {
				if !ok {
					r.Floats[i] = math.NaN()
				}
			}
		} else if cover != nil {
			uncovered(r.Values, r.Partial)
		}
	case Mean:
		if r.Count > 0 {
			if !g.cfg.Type.IsFloat() {
				r.Values = append([]int64(nil), rec.Agg[:g.cfg.Elems]...)
			}
			r.Floats = g.cfg.floats(rec.Agg[:g.cfg.Elems], r.Count)
		}
	case User:
		if r.Count > 0 {
			r.Values = append([]int64(nil), rec.Agg[:g.cfg.Elems]...)
		}
	case Gather:
		per := g.cfg.Elems * g.cfg.Type.Size()
		raw := make([]byte, isg.AggBytes)
		for i, v := range rec.Agg {
			binary.NativeEndian.PutUint64(raw[i*8:], uint64(v))
		}
		for k := 0; k < int(rec.Gathered) && k < g.cfg.GatherK && (k+1)*per <= len(raw); k++ {
			r.Gathered = append(r.Gathered, GatherItem{Worker: int(rec.Order[k]), Payload: append([]byte(nil), raw[k*per:(k+1)*per]...)})
		}
	}
	return r
}

// partials reads the parts map entries of rec's request for the workers not in its
// bitmap (rec.Partial of them hold some parts). The slot is not yet freed, so no later
// request has taken the entries over.
func (g *Group) partials(rec *isg.ResultRec) []PartialReply {
	var out []PartialReply
	n := len(g.cfg.Workers)
	for w := 0; w < n && len(out) < int(rec.Partial); w++ {
		if rec.Bitmap[w/64]&(1<<(w%64)) != 0 {
			continue
		}
		var e isg.PartsRec
		if err := g.objs.Parts.Lookup(uint32(int(rec.Slot)*n+w), &e); err != nil || e.ReqId != rec.ReqId || e.Bits == 0 {
			continue
		}
		p := PartialReply{Worker: w, NParts: int(e.Nparts)}
		for b := range isg.PartsMax {
			if e.Bits&(1<<b) != 0 {
				p.Parts = append(p.Parts, b)
			}
		}
		out = append(out, p)
	}
	return out
}

// covered says which elements of an n-element Min/Max aggregate a part in ps covered;
// the others hold the identity the kernel started them at (SG_F_PARTS) and are reported
// as 0 (floats: NaN), when no worker answered in full.
func covered(n int, ps []PartialReply) []bool {
	c := make([]bool, n)
	for _, p := range ps {
		for _, part := range p.Parts {
			off, k, _ := isg.PartSlice(n, p.NParts, part)
			for i := off; i < off+k; i++ {
				c[i] = true
			}
		}
	}
	return c
}

// uncovered zeroes the elements of an integer Min/Max aggregate that no part in ps
// covered.
func uncovered(v []int64, ps []PartialReply) {
	for i, ok := range covered(len(v), ps) {
		if !ok {
			v[i] = 0
		}
	}
}
