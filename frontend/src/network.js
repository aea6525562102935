// Network page: every node pair's latest pre-flight result; operators start a check of every node.
import { wireCheckButton } from "./netcheck.js";

wireCheckButton(
  document.getElementById("check-network-button"),
  document.getElementById("action-message"),
  ["network-links", "network-hosts", "network-checks"],
);
