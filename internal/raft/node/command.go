package node

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// A log entry's payload is a command as JSON (encoding/json's encoding of the command
// struct). Every node decodes every committed entry, so the two ends have a fast path for
// the shape encoding/json gives a command whose strings are printable ASCII without
// characters it escapes: encodeCommand writes exactly the bytes json.Marshal would, and
// decodeCommand reads exactly those bytes; anything else (another string, a field order or
// spacing it did not write) goes through encoding/json. So the log's format is unchanged:
// entries written by either path, or by an earlier version, decode the same on every node.

// encodeCommand is json.Marshal(c).
func encodeCommand(c *command) ([]byte, error) {
	if !plain(c.Op) || !plain(c.Key) || !plain(c.Value) || !plain(c.Expect) {
		return json.Marshal(c)
	}
	b := make([]byte, 0, 64+len(c.Key)+len(c.Value)+len(c.Expect))
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, c.ID, 10)
	b = appendField(b, `,"op":"`, c.Op)
	b = appendField(b, `,"key":"`, c.Key)
	if c.Value != "" {
		b = appendField(b, `,"value":"`, c.Value)
	}
	if c.Expect != "" {
		b = appendField(b, `,"expect":"`, c.Expect)
	}
	if c.ExpectAbsent {
		b = append(b, `,"expect_absent":true`...)
	}
	return append(b, '}'), nil
}

func appendField(b []byte, name, v string) []byte {
	return append(append(append(b, name...), v...), '"')
}

// plain reports whether encoding/json writes s as it is: printable ASCII other than the
// quote, the backslash and the HTML characters it escapes.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			return false
		}
	}
	return true
}

func plainByte(c byte) bool {
	return c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
}

// decodeCommand is json.Unmarshal(data, c) into a zero c.
func decodeCommand(data []byte, c *command) error {
	if fastDecode(data, c) {
		return nil
	}
	*c = command{}
	return json.Unmarshal(data, c)
}

// fastDecode reads encodeCommand's fast-path output; false: data is not in that form
// (c is then in no defined state).
func fastDecode(d []byte, c *command) bool {
	var ok bool
	if d, ok = bytes.CutPrefix(d, []byte(`{"id":`)); !ok {
		return false
	}
	n := 0
	for n < len(d) && d[n] >= '0' && d[n] <= '9' {
		n++
	}
	if n == 0 || (n > 1 && d[0] == '0') {
		return false
	}
	id, err := strconv.ParseUint(string(d[:n]), 10, 64)
	if err != nil {
		return false
	}
	*c = command{ID: id}
	d = d[n:]
	if c.Op, d, ok = cutField(d, `,"op":"`, true); !ok {
		return false
	}
	if c.Key, d, ok = cutField(d, `,"key":"`, true); !ok {
		return false
	}
	if c.Value, d, ok = cutField(d, `,"value":"`, false); !ok {
		return false
	}
	if c.Expect, d, ok = cutField(d, `,"expect":"`, false); !ok {
		return false
	}
	if rest, found := bytes.CutPrefix(d, []byte(`,"expect_absent":true`)); found {
		c.ExpectAbsent, d = true, rest
	}
	return len(d) == 1 && d[0] == '}'
}

// cutField reads name, a plain string and its closing quote from the start of d. An absent
// optional field is "" and ok; an empty optional one is not how encoding/json writes it.
func cutField(d []byte, name string, required bool) (v string, rest []byte, ok bool) {
	rest, found := bytes.CutPrefix(d, []byte(name))
	if !found {
		return "", d, !required
	}
	end := 0
	for end < len(rest) && plainByte(rest[end]) {
		end++
	}
	if end == len(rest) || rest[end] != '"' || (!required && end == 0) {
		return "", d, false
	}
	return string(rest[:end]), rest[end+1:], true
}
