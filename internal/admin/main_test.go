package admin_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.LeakOptions()...)
}
