// Package crossarch holds a test, and nothing else: the device agent as
// released for arm64 and 32-bit ARMv7 (deploy/release) enrolls with, and
// trains a round for, a real aggregator, each under qemu-user
// (qemu-aarch64-static, qemu-arm-static). It lives apart from deploy/,
// whose tests already take minutes, so that neither package nears go
// test's timeout.
package crossarch
