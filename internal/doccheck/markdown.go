// Package doccheck keeps kedge's documents true to the code. Its tests run every
// walkthrough a document shows (the shell blocks a user would paste) against the built
// binary, check that every repository path and test a document names exists, and that
// every shell block says whether and how it runs.
//
// A walkthrough is a fenced block marked by an HTML comment on the line before it:
//
//	<!-- doctest: run timeout=60s expect="^hello$" -->
//	```sh
//	kedge raft kv get --config /tmp/cluster.yaml greeting
//	```
//
// `sh` blocks run as one bash script (`bash -e -o pipefail`); `console` blocks are
// transcripts: the lines after `$ ` (with their `\` continuations) run as the script and
// the other lines, the output shown to the reader, are not compared. Every block runs in
// a sandbox of its own (unshare: new network, mount and PID namespaces; loopback up; a
// private tmpfs on /tmp and on /run; `kedge` on PATH), so it may use /tmp, /run/netns and
// fixed addresses as a user would, and everything it started or created goes when it
// ends. Keys of a marker:
//
//	run              run the block (the default timeout is 60s)
//	skip="reason"    do not run it, for the reason given (a benchmark, a real NIC, ...)
//	timeout=DUR      bound on the block's run time (at most 5m)
//	needs=a,b        programs the block needs; without them it is skipped, saying so
//	expect="RE"      a regular expression (multi-line mode) the block's combined
//	                 stdout and stderr must match; repeatable
//	session=NAME     blocks of one document with the same session run as one script,
//	                 in document order, in one sandbox (a walkthrough split by prose);
//	                 their timeouts add up
//
// A walkthrough whose script exits with code 3 (kedge: this kernel lacks a feature the
// command needs) is skipped with kedge's message.
//
// Blocks of other languages (yaml, json, go, text for a synopsis or printed output) are
// not walkthroughs. An unlabelled block that starts like a command is an error: label it
// `sh`, `console` or `text`.
package doccheck

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Block is one fenced block of a document.
type Block struct {
	Doc  string // the document's path
	Line int    // line of the opening fence, from 1
	Lang string // the fence's info string (first word)
	Text string // the lines between the fences
	Mark *Mark  // the doctest marker on the line before the fence; nil if none
}

// Mark is a parsed `<!-- doctest: ... -->` marker.
type Mark struct {
	Line    int
	Run     bool
	Skip    string
	Timeout time.Duration
	Needs   []string
	Expect  []*regexp.Regexp
	Session string
}

// Walkthrough languages: blocks a user pastes into a shell.
const (
	LangSh      = "sh"
	LangConsole = "console"
)

// DefaultTimeout and MaxTimeout bound a block's run.
const (
	DefaultTimeout = 60 * time.Second
	MaxTimeout     = 5 * time.Minute
)

var markRE = regexp.MustCompile(`^<!--\s*doctest:(.*)-->\s*$`)

// commandStart says whether an unlabelled block's first line looks like a shell command.
var commandStart = regexp.MustCompile(`^(\$ |sudo |kedge |go (run|test|build) |make |\./|bin/|cat |for |flock |git |ip |cp |curl )`)

// Blocks returns the fenced blocks of a document, each with its marker.
func Blocks(doc string, src []byte) ([]Block, error) {
	lines := strings.Split(string(bytes.ReplaceAll(src, []byte("\r\n"), []byte("\n"))), "\n")
	var out []Block
	var errs []error
	var pending *Mark
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := markRE.FindStringSubmatch(line); m != nil {
			mk, err := ParseMark(m[1])
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %w", doc, i+1, err))
				continue
			}
			mk.Line = i + 1
			pending = mk
			continue
		}
		if !strings.HasPrefix(line, "```") {
			if pending != nil && strings.TrimSpace(line) != "" {
				errs = append(errs, fmt.Errorf("%s:%d: doctest marker not followed by a fenced block", doc, pending.Line))
				pending = nil
			}
			continue
		}
		b := Block{Doc: doc, Line: i + 1, Lang: strings.Fields(line[3:] + " x")[0], Mark: pending}
		if b.Lang == "x" {
			b.Lang = ""
		}
		pending = nil
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			errs = append(errs, fmt.Errorf("%s:%d: fenced block not closed", doc, b.Line))
		}
		b.Text = strings.Join(body, "\n")
		out = append(out, b)
	}
	if pending != nil {
		errs = append(errs, fmt.Errorf("%s:%d: doctest marker not followed by a fenced block", doc, pending.Line))
	}
	return out, errors.Join(errs...)
}

// Check says what is wrong with a block's marking, or nil.
func (b Block) Check() error {
	walk := b.Lang == LangSh || b.Lang == LangConsole
	switch {
	case b.Mark != nil && !walk:
		return fmt.Errorf("%s:%d: doctest marker on a %q block (only sh and console blocks run)", b.Doc, b.Line, b.Lang)
	case walk && b.Mark == nil:
		return fmt.Errorf("%s:%d: %s block without a doctest marker: mark it run, or skip with the reason", b.Doc, b.Line, b.Lang)
	case b.Lang == "" && commandStart.MatchString(strings.TrimLeft(firstLine(b.Text), " ")):
		return fmt.Errorf("%s:%d: unlabelled block that starts like a command (%q): label it sh or console (a walkthrough) or text (a synopsis)", b.Doc, b.Line, firstLine(b.Text))
	case b.Lang == LangConsole && !strings.Contains("\n"+b.Text, "\n$ "):
		return fmt.Errorf("%s:%d: console block without a `$ ` command line", b.Doc, b.Line)
	}
	return nil
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			return l
		}
	}
	return ""
}

// Script is what runs for the block: an sh block as it stands, a console block's commands
// (the lines after `$ `, with their continuation lines).
func (b Block) Script() string {
	if b.Lang != LangConsole {
		return b.Text + "\n"
	}
	var sb strings.Builder
	cont := false
	for _, l := range strings.Split(b.Text, "\n") {
		switch {
		case cont:
			sb.WriteString(l + "\n")
		case strings.HasPrefix(l, "$ "):
			sb.WriteString(l[2:] + "\n")
		default:
			continue
		}
		cont = strings.HasSuffix(l, "\\")
	}
	return sb.String()
}

// ParseMark parses the text after `doctest:` in a marker.
func ParseMark(s string) (*Mark, error) {
	toks, err := tokens(s)
	if err != nil {
		return nil, err
	}
	m := &Mark{Timeout: DefaultTimeout}
	for _, t := range toks {
		k, v, hasV := strings.Cut(t, "=")
		switch {
		case k == "run" && !hasV:
			m.Run = true
		case k == "skip" && hasV && strings.TrimSpace(v) != "":
			m.Skip = v
		case k == "timeout" && hasV:
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 || d > MaxTimeout {
				return nil, fmt.Errorf("doctest marker: timeout %q: want a duration in (0, %v]", v, MaxTimeout)
			}
			m.Timeout = d
		case k == "needs" && hasV:
			m.Needs = strings.Split(v, ",")
		case k == "session" && hasV && v != "":
			m.Session = v
		case k == "expect" && hasV:
			re, err := regexp.Compile("(?m)" + v)
			if err != nil {
				return nil, fmt.Errorf("doctest marker: expect %q: %w", v, err)
			}
			m.Expect = append(m.Expect, re)
		default:
			return nil, fmt.Errorf("doctest marker: unknown or malformed %q (want run, skip=\"reason\", timeout=DUR, needs=a,b, expect=\"RE\", session=NAME)", t)
		}
	}
	if m.Run == (m.Skip != "") {
		return nil, errors.New(`doctest marker: say either run or skip="reason"`)
	}
	return m, nil
}

// tokens splits a marker's text at spaces outside double quotes; a quoted value loses its
// quotes, and \" inside it is a quote (other backslashes stay, for regular expressions).
func tokens(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in, have := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case in && c == '\\' && i+1 < len(s) && s[i+1] == '"':
			cur.WriteByte('"')
			i++
		case c == '"':
			in, have = !in, true
		case !in && (c == ' ' || c == '\t' || c == '\n'):
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if in {
		return nil, errors.New("doctest marker: unterminated quote")
	}
	if have {
		out = append(out, cur.String())
	}
	return out, nil
}
