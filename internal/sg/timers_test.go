package sg

import "testing"

// TestUntimedInUse: sg_timers_init stops at its first failure and returns how many slots
// from there on are left, so a group's slots below that point all have their timer.
func TestUntimedInUse(t *testing.T) {
	for _, c := range []struct{ inUse, failed, want int }{
		{32, 0, 0},       // every slot has a timer
		{32, 485, 0},     // the init stopped at slot 539: a group of 32 is covered
		{1024, 485, 485}, // a group of every slot is not
		{600, 485, 61},   // slots 539..599
		{32, Slots, 32},  // the first slot failed
		{0, Slots, 0},    // no slots in use
		{539, 485, 0},    // up to the first failure exactly
		{540, 485, 1},
	} {
		if got := untimedInUse(c.inUse, c.failed); got != c.want {
			t.Errorf("untimedInUse(%d, %d) = %d, want %d", c.inUse, c.failed, got, c.want)
		}
	}
}
