package rafttest

import "fmt"

// DiscardLogger is an etcd-raft Logger (raft.Config.Logger) that drops every line and
// panics where etcd-raft's own logger would end the process.
type DiscardLogger struct{}

func (DiscardLogger) Debug(...any)              {}
func (DiscardLogger) Debugf(string, ...any)     {}
func (DiscardLogger) Info(...any)               {}
func (DiscardLogger) Infof(string, ...any)      {}
func (DiscardLogger) Warning(...any)            {}
func (DiscardLogger) Warningf(string, ...any)   {}
func (DiscardLogger) Error(...any)              {}
func (DiscardLogger) Errorf(string, ...any)     {}
func (DiscardLogger) Panicf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (DiscardLogger) Panic(a ...any)            { panic(fmt.Sprint(a...)) }
func (DiscardLogger) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (DiscardLogger) Fatal(a ...any)            { panic(fmt.Sprint(a...)) }
