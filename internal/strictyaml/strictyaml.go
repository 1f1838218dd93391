// Package strictyaml decodes YAML config files strictly and says what is wrong in the
// user's terms: an unknown key is named with its path and line, the nearest valid key is
// suggested ("line 7: services[0]: unknown key \"adress\": did you mean \"address\"?"), and
// an empty file says that it is empty. Every kedge config file is read through it.
//
// Keys are checked against the Go types' yaml tags (inline structs included). A type with
// its own UnmarshalYAML declares the keys of its mapping form by implementing Shaper;
// without it, the keys below it are left to its UnmarshalYAML.
package strictyaml

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// ErrEmpty is returned for a document with nothing in it (or only comments).
var ErrEmpty = errors.New("the file is empty")

// Shaper is implemented by a type with a custom UnmarshalYAML whose mapping form has known
// keys: YAMLShape returns a value of a struct type whose yaml tags are those keys.
type Shaper interface {
	YAMLShape() any
}

// Decode decodes one YAML document into v (a pointer) with unknown keys as errors.
func Decode(data []byte, v any) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	if doc.Kind == 0 || (doc.Kind == yaml.DocumentNode && (len(doc.Content) == 0 || isNull(doc.Content[0]))) {
		return ErrEmpty
	}
	t := reflect.TypeOf(v)
	if t.Kind() != reflect.Pointer {
		return fmt.Errorf("strictyaml: decode into %s, want a pointer", t)
	}
	if err := check(&doc, t.Elem(), ""); err != nil {
		return err
	}
	return doc.Decode(v)
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

var (
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	shaperType      = reflect.TypeFor[Shaper]()
)

// check walks n against type t; path names n for messages ("services[0].delay").
func check(n *yaml.Node, t reflect.Type, path string) error {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := check(c, t, path); err != nil {
				return err
			}
		}
		return nil
	case yaml.AliasNode:
		return check(n.Alias, t, path)
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) || t.Implements(unmarshalerType) {
		if n.Kind != yaml.MappingNode {
			return nil
		}
		s, ok := reflect.Zero(t).Interface().(Shaper)
		if !ok {
			return nil // its UnmarshalYAML judges its keys
		}
		t = reflect.TypeOf(s.YAMLShape())
	}
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := structFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if k.Value == "<<" { // a merge key: its mapping's keys belong here
				if err := check(val, t, path); err != nil {
					return err
				}
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				return unknownKey(k, path, fields)
			}
			if err := check(val, ft, join(path, k.Value)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := check(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.SequenceNode && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i, c := range n.Content {
			if err := check(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() != reflect.Interface:
		return fmt.Errorf("line %d: %s: want %s, got a mapping of keys", n.Line, orTop(path), kindName(t))
	case n.Kind == yaml.SequenceNode && t.Kind() != reflect.Interface:
		return fmt.Errorf("line %d: %s: want %s, got a list", n.Line, orTop(path), kindName(t))
	case n.Kind == yaml.ScalarNode && !isNull(n) && (t.Kind() == reflect.Struct || t.Kind() == reflect.Map):
		return fmt.Errorf("line %d: %s: want a mapping of keys (%s), got %q", n.Line, orTop(path), keyList(t), n.Value)
	case n.Kind == yaml.ScalarNode && !isNull(n) && t.Kind() == reflect.Slice:
		return fmt.Errorf("line %d: %s: want a list, got %q (write [%s] for a list of one)", n.Line, orTop(path), n.Value, n.Value)
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "the document"
	}
	return path
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "a mapping of keys"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a value"
}

// structFields maps the yaml keys of struct t (inline structs flattened) to their types.
func structFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if slices.Contains(strings.Split(opts, ","), "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range structFields(ft) {
					out[k] = v
				}
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name) // yaml.v3's default key
		}
		out[name] = f.Type
	}
	return out
}

func keyList(t reflect.Type) string {
	if t.Kind() != reflect.Struct {
		return "any keys"
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range structFields(t) {
			if !yield(k) {
				return
			}
		}
	})
	return strings.Join(keys, ", ")
}

func unknownKey(k *yaml.Node, path string, fields map[string]reflect.Type) error {
	where := ""
	if path != "" {
		where = path + ": "
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for name := range fields {
			if !yield(name) {
				return
			}
		}
	})
	if s := Nearest(k.Value, keys); s != "" {
		return fmt.Errorf("line %d: %sunknown key %q: did you mean %q?", k.Line, where, k.Value, s)
	}
	return fmt.Errorf("line %d: %sunknown key %q: valid keys here are %s", k.Line, where, k.Value, strings.Join(keys, ", "))
}

// Nearest returns the candidate closest to s by edit distance, if it is close enough to be
// a typo (at most a third of the longer word's length in edits, at least 2), else "".
func Nearest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	for _, c := range candidates {
		if d := distance(strings.ToLower(s), c); d < bestD {
			best, bestD = c, d
		}
	}
	limit := max(2, max(len(s), len(best))/3)
	if bestD > limit {
		return ""
	}
	return best
}

// distance is the Damerau-Levenshtein distance (adjacent transpositions count one edit).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
