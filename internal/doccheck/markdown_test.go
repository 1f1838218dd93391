package doccheck

import (
	"strings"
	"testing"
	"time"
)

func TestParseMark(t *testing.T) {
	m, err := ParseMark(` run timeout=90s needs=dig,iperf3 expect="^ok \(index [0-9]+\)$" expect="say \"hi\"" `)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Run || m.Skip != "" || m.Timeout != 90*time.Second || strings.Join(m.Needs, "|") != "dig|iperf3" || len(m.Expect) != 2 {
		t.Fatalf("mark %+v", m)
	}
	if !m.Expect[0].MatchString("x\nok (index 7)\ny") || !m.Expect[1].MatchString(`say "hi"`) {
		t.Errorf("expects %v", m.Expect)
	}
	if m, err := ParseMark(`skip="a benchmark: minutes on a quiet machine"`); err != nil || m.Run || m.Skip != "a benchmark: minutes on a quiet machine" || m.Timeout != DefaultTimeout {
		t.Errorf("skip: %+v, %v", m, err)
	}
	for _, bad := range []string{``, `run skip="x"`, `skip=""`, `skip`, `run timeout=10m`, `run timeout=x`, `run expect="("`, `run expect="x`, `run colour=blue`, `rn`} {
		if _, err := ParseMark(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestBlocks(t *testing.T) {
	doc := "# T\n\n<!-- doctest: run expect=\"hello\" -->\n```sh\necho hello\n```\n\ntext\n```console\n$ kedge a \\\n    --b\noutput line\n$ kedge c\nmore output\n```\n" +
		"```\nkedge raft serve [--id N]\n```\n```text\nkedge raft serve [--id N]\n```\n```yaml\nk: v\n```\n```\n box\n```\n"
	bs, err := Blocks("t.md", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 6 {
		t.Fatalf("%d blocks: %+v", len(bs), bs)
	}
	if bs[0].Lang != "sh" || bs[0].Line != 4 || bs[0].Mark == nil || bs[0].Mark.Line != 3 || bs[0].Script() != "echo hello\n" || bs[0].Check() != nil {
		t.Errorf("sh block %+v", bs[0])
	}
	if got := bs[1].Script(); got != "kedge a \\\n    --b\nkedge c\n" {
		t.Errorf("console script %q", got)
	}
	if err := bs[1].Check(); err == nil || !strings.Contains(err.Error(), "t.md:9: console block without a doctest marker") {
		t.Errorf("unmarked console block: %v", err)
	}
	if err := bs[2].Check(); err == nil || !strings.Contains(err.Error(), "unlabelled block that starts like a command") {
		t.Errorf("unlabelled command: %v", err)
	}
	for _, b := range bs[3:] {
		if err := b.Check(); err != nil {
			t.Errorf("%s block: %v", b.Lang, err)
		}
	}
	for _, bad := range []string{
		"<!-- doctest: run -->\ntext\n```sh\nx\n```\n", // not right before a block
		"<!-- doctest: run -->\n",                      // at the end
		"<!-- doctest: runn -->\n```sh\nx\n```\n",      // bad marker
		"```sh\nx\n", // not closed
		"<!-- doctest: run -->\n```yaml\nx\n```\n", // fine for Blocks, refused by Check
	} {
		bs, err := Blocks("b.md", []byte(bad))
		if err == nil && (len(bs) == 0 || bs[0].Check() == nil) {
			t.Errorf("%q: no error", bad)
		}
	}
}
