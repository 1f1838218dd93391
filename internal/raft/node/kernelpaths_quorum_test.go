package node

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
)

// TestLabQuorumWait: a keyed 3-node cluster of real processes with every kernel path on,
// written to by several clients at once. The leader's program absorbs the followers'
// acknowledgements that move nothing, the node steps its record, and when the writes stop
// every follower's match reaches the leader's log end: a follower whose acknowledgements
// were all absorbed is not left behind (without the node's feed, the duplicate answers to
// the leader's probes are absorbed as well and its match never moves). Every write
// committed, and the cluster kept its leader.
func TestLabQuorumWait(t *testing.T) {
	c := offloadCluster(t, "rqw")
	lead := c.waitLeader(1, 2, 3)
	before, err := c.status(lead)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.client(lead)
			for i := range 100 {
				c.put(cl, fmt.Sprintf("k%d", w), fmt.Sprint(i))
			}
		}()
	}
	wg.Wait()
	in, err := c.inspect(lead)
	if err != nil {
		t.Fatal(err)
	}
	if in.Counters["app_absorbed"] < 100 || in.Counters["app_recorded"] < 100 {
		t.Errorf("the leader's program absorbed %d and passed %d acknowledgements of 400 writes: the wait is not working",
			in.Counters["app_absorbed"], in.Counters["app_recorded"])
	}
	fed, err := c.metric(lead, "kedge_raft_offload_quorum_fed_total")
	if err != nil {
		t.Fatal(err)
	}
	if fed == 0 {
		t.Error("the leader stepped no record of absorbed acknowledgements")
	}
	var s api.Status
	defer func() {
		if t.Failed() {
			t.Logf("leader %d status: %+v", lead, s)
		}
	}()
	c.waitFor("every follower's match at the leader's log end", 5*time.Second, func() bool {
		if s, err = c.status(lead); err != nil || len(s.Peers) != 2 {
			return false
		}
		for _, p := range s.Peers {
			if p.Match != s.LastIndex {
				return false
			}
		}
		return true
	})
	if s.Term != before.Term || s.Leader != lead {
		t.Errorf("leader %d term %d after the writes, was %d term %d", s.Leader, s.Term, lead, before.Term)
	}
	t.Logf("leader %d: %d acknowledgements absorbed, %d passed, %v records stepped; matches %+v at log end %d",
		lead, in.Counters["app_absorbed"], in.Counters["app_recorded"], fed, s.Peers, s.LastIndex)
}
