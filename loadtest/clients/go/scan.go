package main

// Just enough JSON to find a few fields in a server's frame without decoding
// the rest: the client's CPU per frame is spent on the same cores as the
// server's, so it skips values rather than building them.

import (
	"bytes"
	"strconv"
	"unsafe"
)

// field returns the raw value of key at the top level of the JSON object obj
// (a string keeps its quotes), or nil. Values are skipped by their syntax, so a
// key's name inside a string or a nested object never matches.
func field(obj []byte, key string) []byte {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil
	}
	i++
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return nil // '}' (the end) or malformed
		}
		end := skipString(obj, i)
		if end < 0 {
			return nil
		}
		name := obj[i+1 : end-1]
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return nil
		}
		i = skipSpace(obj, i+1)
		vend := skipValue(obj, i)
		if vend < 0 {
			return nil
		}
		if string(name) == key { // no allocation: the compiler compares in place
			return obj[i:vend]
		}
		i = skipSpace(obj, vend)
		if i >= len(obj) || obj[i] != ',' {
			return nil
		}
		i++
	}
}

// path follows nested objects: path(doc, "push", "pub", "data").
func path(obj []byte, keys ...string) []byte {
	for _, k := range keys {
		if obj = field(obj, k); obj == nil {
			return nil
		}
	}
	return obj
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"', or -1.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue returns the index after the value starting at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end := skipString(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default: // a number, true, false, null
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' &&
			b[j] != '\r' && b[j] != '\t' {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}

// asInt reads an integer value, bare or quoted ("123" as some servers send ids).
func asInt(raw []byte) (int64, bool) {
	raw = unquote(raw)
	if len(raw) == 0 || len(raw) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// asFloat reads a number value, bare or quoted.
func asFloat(raw []byte) (float64, bool) {
	return parseFloat(unquote(raw))
}

// unquote strips a string's quotes; escapes are left as they are (the values read here have none).
func unquote(raw []byte) []byte {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		return raw[1 : len(raw)-1]
	}
	return raw
}

// leadingFloat reads the number a message body starts with ("1700000000.123456 feed"),
// the wall-clock time the feed put in it.
func leadingFloat(s []byte) (float64, bool) {
	if k := bytes.IndexByte(s, ' '); k >= 0 {
		s = s[:k]
	}
	return parseFloat(s)
}

// parseFloat without copying the bytes into a string: this runs once per frame.
func parseFloat(b []byte) (float64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	f, err := strconv.ParseFloat(unsafe.String(&b[0], len(b)), 64)
	return f, err == nil
}
