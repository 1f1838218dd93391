package node

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
)

// The fast paths must be encoding/json exactly: the log's entries are JSON, written and
// read by nodes of any version.
func TestCommandCodec(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", " ", "/", "~", "\"", "\\", "<", ">", "&", "\n", "\x00", "\x7f", "é", "\u2028", "\xff", "{", "}", ","}
	str := func() string {
		var s string
		for range rng.IntN(6) {
			if rng.IntN(4) == 0 {
				s += alphabet[rng.IntN(len(alphabet))]
			} else {
				s += string(rune('a' + rng.IntN(26)))
			}
		}
		return s
	}
	cases := []command{
		{}, {ID: 1, Op: "put", Key: "k", Value: "v"}, {ID: 1<<64 - 1, Op: "cas", Key: "tp/001", Value: "x", Expect: "y"},
		{ID: 7, Op: "cas", Key: "k", Value: "v", ExpectAbsent: true}, {ID: 9, Op: "del", Key: "k"},
		{ID: 3, Op: "put", Key: "a<b", Value: "\"quoted\""},
	}
	for range 2000 {
		cases = append(cases, command{ID: rng.Uint64() >> rng.IntN(64), Op: str(), Key: str(), Value: str(), Expect: str(), ExpectAbsent: rng.IntN(2) == 0})
	}
	fast := 0
	for _, c := range cases {
		want, err := json.Marshal(&c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeCommand(&c)
		if err != nil || string(got) != string(want) {
			t.Fatalf("encodeCommand(%+v) = %q, %v; json.Marshal gives %q", c, got, err, want)
		}
		var viaJSON, viaFast command
		if err := json.Unmarshal(want, &viaJSON); err != nil {
			t.Fatal(err)
		}
		if err := decodeCommand(want, &viaFast); err != nil || viaFast != viaJSON {
			t.Fatalf("decodeCommand(%q) = %+v, %v; json.Unmarshal gives %+v", want, viaFast, err, viaJSON)
		}
		var probe command
		if fastDecode(want, &probe) {
			fast++
		}
	}
	if fast < len(cases)/4 {
		t.Errorf("the fast path decoded only %d of %d encodings", fast, len(cases))
	}
	t.Logf("%d of %d commands decoded by the fast path", fast, len(cases))
}

// FuzzDecodeCommand: whatever the bytes, decodeCommand gives what json.Unmarshal gives.
func FuzzDecodeCommand(f *testing.F) {
	for _, s := range []string{`{"id":1,"op":"put","key":"k","value":"v"}`, `{"id":01,"op":"put","key":"k"}`,
		`{"id":2,"op":"cas","key":"k","expect_absent":true}`, `{"id":2,"op":"cas","key":"k","value":""}`,
		`{"id":3,"op":"put","key":"k","value":"v","extra":1}`, `{"id":3,"op":"put","key":"k"} `, `{"ID":3,"op":"put","key":"k"}`,
		`{"id":18446744073709551616,"op":"put","key":"k"}`, `{"id":4,"op":"put","key":"a\u003cb"}`, `{"id":5,"op":"put","key":"k","value":"v"`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want, got command
		werr := json.Unmarshal(data, &want)
		gerr := decodeCommand(data, &got)
		if (werr == nil) != (gerr == nil) || (werr == nil && !reflect.DeepEqual(want, got)) {
			t.Fatalf("decodeCommand(%q) = %+v, %v; json.Unmarshal gives %+v, %v", data, got, gerr, want, werr)
		}
	})
}
