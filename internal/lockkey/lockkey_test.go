package lockkey

import "testing"

// The two-key classes are distinct: two kinds of lock on one name must
// not be one lock (the sampler's turn on table outbox is not the listen
// lock of channel outbox).
func TestClassesAreDistinct(t *testing.T) {
	seen := map[int]string{}
	for name, class := range map[string]int{"GateV2": GateV2, "Gate": Gate, "Sampler": Sampler, "Listen": Listen, "Relay": Relay} {
		if other, ok := seen[class]; ok {
			t.Fatalf("%s and %s share class %d", name, other, class)
		}
		seen[class] = name
	}
}
