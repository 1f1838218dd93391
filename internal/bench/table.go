package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// TableHeader is the header of WriteTable: the columns of the thesis's Table 4.2 (with P99.9
// added) plus the extra load hedging causes and where the hedges went.
var TableHeader = []string{"Method", "P50 (ms)", "P95 (ms)", "P99 (ms)", "P99.9 (ms)", "MAX (ms)",
	"P99 reduction", "Extra load", "Backend"}

// TableRows formats one row per summary. The P99 reduction is against the summary named
// baseline ("-" for the baseline itself and when it is absent); unknown extra load and an
// empty backend print as "-".
func TableRows(sums []Summary, baseline string) [][]string {
	baseP99 := math.NaN()
	for _, s := range sums {
		if s.Name == baseline {
			baseP99 = s.P99
		}
	}
	rows := make([][]string, 0, len(sums))
	for _, s := range sums {
		red := "-"
		if s.Name != baseline {
			if r := Reduction(baseP99, s.P99); !math.IsNaN(r) {
				red = fmt.Sprintf("%.1f%%", r)
			}
		}
		load := "-"
		if !math.IsNaN(s.ExtraLoad) {
			load = fmt.Sprintf("%.1f%%", s.ExtraLoad*100)
		}
		backend := s.Backend
		if backend == "" {
			backend = "-"
		}
		rows = append(rows, []string{s.Name, ms(s.P50), ms(s.P95), ms(s.P99), ms(s.P999), ms(s.Max), red, load, backend})
	}
	return rows
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// WriteTable prints the summaries as a Markdown pipe table with padded columns, readable in
// a terminal and pasteable into docs/. Text columns are left-aligned, numbers right-aligned.
func WriteTable(w io.Writer, sums []Summary, baseline string) error {
	rows := append([][]string{TableHeader}, TableRows(sums, baseline)...)
	widths := make([]int, len(TableHeader))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	leftAligned := func(col int) bool { return col == 0 || col == len(TableHeader)-1 }
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", widths[i]-len(c))
			if leftAligned(i) {
				b.WriteString(" " + c + pad + " |")
			} else {
				b.WriteString(" " + pad + c + " |")
			}
		}
		b.WriteString("\n")
	}
	line(rows[0])
	b.WriteString("|")
	for i, wd := range widths {
		if leftAligned(i) {
			b.WriteString(" " + strings.Repeat("-", wd) + " |")
		} else {
			b.WriteString(" " + strings.Repeat("-", wd-1) + ": |")
		}
	}
	b.WriteString("\n")
	for _, r := range rows[1:] {
		line(r)
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}
